"""SGLang 0.5.17's Triton GQA decode attention priced from its launch geometry (perfmodel/server/triton_gqa.py): the
splits, programs and loop iterations its source gives, the per-iteration cost read back from lease 14's raw files, and
the planner's decode step: with one KV head a GPU the context costs a latency flat in batch, only on Triton GQA."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks import triton_gqa_context as read
from orchestrator.config.model_presets import MODEL_PRESETS
from orchestrator.perfmodel.costmodel import build_cost_model
from orchestrator.perfmodel.server.triton_gqa import (TRITON_GQA_ITERATION_S, head_tiles, kv_splits,
                                                      loop_iterations)

QWEN3 = MODEL_PRESETS["qwen3-235b-a22b-fp8"]
R1 = MODEL_PRESETS["DeepSeek-R1"]


def test_one_kv_head_a_gpu_gives_a_small_batch_eight_programs_a_request_each_walking_an_eighth_of_the_context() -> None:
    # TP 4: 16 query heads, 1 KV head -> one head tile; 132 SMs, context 4,146 -> 132 * log2(64.8) = 795 cores
    assert head_tiles(16, 1) == 1 and head_tiles(64, 4) == 4
    assert kv_splits(4146, 1, 16, 1, 132) == 8  # capped by --triton-attention-num-kv-splits
    assert loop_iterations(4146, 8) == 17 and loop_iterations(306, 8) == 2
    assert kv_splits(306, 64, 16, 1, 132) == 5  # 132 * max(log2(4.8), 1) = 299 cores over 64 programs
    assert kv_splits(4146, 256, 64, 4, 132) == 1  # TP 1 at batch 256: 1,024 programs already fill the SMs
    assert kv_splits(4146, 1, 16, 1, 132, max_splits=64) == 64  # a larger cap splits further


def test_the_per_iteration_cost_is_what_lease_14s_raw_files_give() -> None:
    samples = read.per_iteration_samples()
    assert len(samples) == 16  # 94 and 48 layers x batch 1, 4, 8, 12 x two repeats
    assert sorted(samples)[len(samples) // 2 - 1] <= TRITON_GQA_ITERATION_S <= sorted(samples)[len(samples) // 2]


def _qwen3(layers: int, backend: str, tp: int = 4, gpu: str = "H200"):
    return build_cost_model(replace(QWEN3, num_hidden_layers=layers), gpu, "fp8", tp=tp, ep=tp,
                            attention_backend=backend, load_format="dummy", role="aggregated", page_size=1,
                            context_length=8192, cuda_graph_max_bs=256, prefill_graphs=False)


def test_at_tp4_the_context_costs_the_same_latency_at_batch_1_and_64() -> None:
    model = _qwen3(94, "triton")
    growth = {b: model.decode_step_s(b, b * 4146) - model.decode_step_s(b, b * 306) for b in (1, 64)}
    expected = 94 * (17 - 2) * TRITON_GQA_ITERATION_S
    assert growth[1] == pytest.approx(expected, rel=0.02)
    assert growth[64] == pytest.approx(expected, rel=0.02)  # the KV bytes (~33 us a layer) stay under the latency


def test_the_latency_gives_way_to_the_bytes_when_the_batch_reads_more_than_it_waits() -> None:
    model = _qwen3(6, "triton", tp=1)
    kv_s = 6 * read.bytes_s(4146, 256, 1, "H200")  # 2.2 GB a layer: 566 us, over 130 iterations' 404 us
    assert model._triton_gqa_wait_s(256, 256 * 4146, kv_s, None) == 0.0
    assert model._triton_gqa_wait_s(1, 4146, 1e-6, None) == pytest.approx(6 * 17 * TRITON_GQA_ITERATION_S - 1e-6)


def test_other_kernels_pay_no_triton_latency() -> None:
    assert _qwen3(94, "fa3")._triton_gqa_wait_s(1, 4146, 0.0, None) == 0.0
    r1 = build_cost_model(R1, "H200", "fp8", tp=8, attention_backend="triton")
    assert r1._triton_gqa_wait_s(1, 4146, 0.0, None) == 0.0  # MLA: splits scale with SMs and context
