"""SGLang 0.5.17's Triton decode attention over GQA heads (Qwen3), from its launch geometry: how many KV splits each
request gets, how many programs (CTAs) run, how many 32-token loop iterations each walks, and the latency that sets.

Source (read only): sglang/kernels/ops/attention/decode_attention.py `_decode_grouped_att_m_fwd` launches
grid = (batch, cdiv(q heads, min(16, q heads per KV head)), max_kv_splits) programs of 4 warps; each walks its split,
cdiv(cdiv(seq_len, splits), 32) * 32 tokens, in BLOCK_N = 32 token steps, one after another (each step loads the
token indices, then the K rows they point to, then V). sglang/kernels/ops/attention/metadata.py
`get_num_kv_splits_triton` picks the splits of equal-length requests as
min(cdiv(SMs * max(log2(seq_len / 64), 1), programs per split), max_kv_splits), and max_kv_splits is
--triton-attention-num-kv-splits (8) for GQA: only MLA gets the SM-count cap (triton_backend.py
`_mla_decode_kv_splits_cap`). So with one KV head a GPU (Qwen3 at TP 4) and a small batch a few programs each walk
an eighth of the context in series, and the kernel's time grows with the context per program, not with the bytes
over HBM bandwidth: a GPU decode layer's attention takes max(its KV bytes at the read rate, iterations x
TRITON_GQA_ITERATION_S) (docs/fidelity.md, "The Triton GQA decode attention's context latency")."""

from __future__ import annotations

import math

from orchestrator.perfmodel import sglang_defaults as sgd

BLOCK_N = 32  # decode_attention.py: BLOCK = 32 tokens a loop step (MIN_BLOCK_KV = 32 rounds each split to it)
BLOCK_H = 16  # decode_attention.py: query heads one program covers
# Seconds of one 32-token loop step of one program, per layer, on Hopper (H100 and H200: the same SM clock; the step
# waits on dependent loads, not on HBM bandwidth). Read by benchmarks/triton_gqa_context.py from lease 14's raw
# files (94 and 48 layers, TP 4 x EP 4, one KV head a GPU, batch 1-12, context 256 -> 4,096: the median of
# step growth / layers / iterations added), output benchmarks/results/2026-11-27-triton-gqa-context/;
# tests/perfmodel/test_triton_gqa.py recomputes it from those files.
TRITON_GQA_ITERATION_S = 3.11e-6


def kv_splits(seq_len: int, requests: int, q_heads: int, kv_heads: int, sm_count: int,
              max_splits: int = sgd.TRITON_NUM_KV_SPLITS) -> int:
    """KV splits get_num_kv_splits_triton gives each of `requests` requests of `seq_len` tokens (equal lengths)."""
    if seq_len <= 0 or requests <= 0:
        return 1
    per_split_programs = requests * head_tiles(q_heads, kv_heads)
    cores = int(sm_count * max(math.log2(seq_len / 64), 1.0))
    by_sms = min(math.ceil(cores / per_split_programs), max_splits)
    return math.ceil(seq_len / math.ceil(seq_len / by_sms))


def head_tiles(q_heads: int, kv_heads: int) -> int:
    """Programs a request's query heads take per split: cdiv(q heads, min(BLOCK_H, q heads per KV head))."""
    group = max(1, q_heads // max(1, kv_heads))
    return math.ceil(q_heads / min(BLOCK_H, group))


def loop_iterations(seq_len: int, splits: int) -> int:
    """32-token steps one program walks: its split, cdiv(cdiv(seq_len, splits), 32) blocks."""
    return max(1, math.ceil(math.ceil(seq_len / max(1, splits)) / BLOCK_N))


def attention_latency_s(seq_len: float, requests: int, q_heads: int, kv_heads: int, sm_count: int,
                        max_splits: int = sgd.TRITON_NUM_KV_SPLITS) -> float:
    """One decode layer's Triton GQA attention as a latency: the iterations of one program x TRITON_GQA_ITERATION_S."""
    length = max(1, math.ceil(seq_len))
    splits = kv_splits(length, requests, q_heads, kv_heads, sm_count, max_splits)
    return loop_iterations(length, splits) * TRITON_GQA_ITERATION_S
