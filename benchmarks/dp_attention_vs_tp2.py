"""DP attention 2 + EP2 against TP 2 on two H200s, and the MLA decode attention's context cost per GPU (issue 25).

Reads the raw calibration files (no GPU, no model fit) and prints:
  1. the decode step of DP-attention 2 + EP2 and of TP 2 at the same batch (the same attention work per GPU: B / 2
     requests x 128 heads against B x 64), the measured gap and the model's gap;
  2. per context point (batch 16, context per request 256 ... 15,000) of every R1-shaped run: the step, the extra
     time per layer over the context-256 point, and the grid SGLang 0.5.17's triton MLA decode kernel runs for it
     (kernels/ops/attention/metadata.py get_num_kv_splits_triton, decode_attention.py _fwd_grouped_kernel_stage1):
     CTAs = requests x 16-head tiles x non-empty KV splits, and the 32-token tiles they walk (W). A CUDA-graph
     batch padded to a larger captured size carries rows of length 1, which raise every request's split count
     up to the cap (64 with --triton-attention-split-tile-size 256): many short walks; a batch at a captured size runs the SM-count heuristic: few long walks.

Usage (repo root): .venv/bin/python benchmarks/dp_attention_vs_tp2.py
"""

from __future__ import annotations

import bisect
import json
import math
from pathlib import Path

from orchestrator.compressed import read_text
from orchestrator.perfmodel.parallel.two_gpu_vs_model import server_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results"
DP = RESULTS / "2026-11-26-two-gpu-h200x2/call3-calibration/calibration-twogpu-b.json.xz"
TP2 = RESULTS / "2026-11-26-two-gpu-tp2-h200x2/calibration-twogpu-tp2.json.xz"
PADDING = RESULTS / "2026-11-26-context-graph-padding-h100/calibration-r1s6-graphpad.json"
PADDING_2GPU = RESULTS / "2026-11-26-two-gpu-lease3-h100x2/call3-tp1-eager-graphpad/calibration-r1s6-graphpad.json.xz"
LEASE4 = RESULTS / "2026-11-26-two-gpu-lease4-h100x2/call6-r1-lease4/calibration-r1s6-lease4.json.xz"
CONTEXT_RUNS = [  # (label, raw file, variant, GPU SMs, query heads per GPU, requests per GPU at batch 16)
    ("H200 TP1 (one-GPU machine)", RESULTS / "2026-11-26-dummy-routing-h200/call2/calibration-dummy-graphs.json.xz",
     "dummy-graphs", 132, 128, 16),
    ("H100 TP1 (one-GPU machine)", RESULTS / "2026-11-24-calibration-h100-r1shaped/calibration-r1s6.json.xz",
     "cold-default", 132, 128, 16),
    ("H200 TP2 (two-GPU machine)", TP2, "tp2", 132, 64, 16),
    ("H200 DP-attn 2 rank (two-GPU machine)", DP, "dpattn2-ep2", 132, 128, 8),
    # hctx: one H100, the same server with and without a captured graph of 16 (plans/r1-graph-padding.json)
    ("H100 TP1, 16 captured (hctx)", PADDING, "graphs-with-16", 132, 128, 16),
    ("H100 TP1, 16 not captured (hctx)", PADDING, "graphs-without-16", 132, 128, 16),
    # hgpu, lease 3: the same plan on GPU 0 of a two-H100 machine (the machine, not TP / DP, in the 46-48 ns?)
    ("H100 TP1, two-GPU host, 16 captured", PADDING_2GPU, "graphs-with-16", 132, 128, 16),
    ("H100 TP1, two-GPU host, 16 padded", PADDING_2GPU, "graphs-without-16", 132, 128, 16),
    # hgpu3, lease 4: graphed TP 2 (64 heads per GPU) beside TP 1 on one two-H100 host, the same graph list
    ("H100 TP2, two-GPU host, 16 captured (l4)", LEASE4, "tp2-graphs-with-16", 132, 64, 16),
    ("H100 TP1, two-GPU host, 16 captured (l4)", LEASE4, "tp1-graphs-with-16", 132, 128, 16),
]
# every run here passes --triton-attention-split-tile-size 256, which replaces _mla_decode_kv_splits_cap's 256
# (triton_backend.py: max_kv_splits = ceil(context_len / split_tile_size)): 16,384 / 256 = 64 splits at most
MLA_SPLIT_CAP = 64
TILE = 32  # BLOCK_N and _MIN_BLOCK_KV of the grouped decode kernel
HEAD_TILE = 16  # BLOCK_H


def _run(path: Path, variant: str) -> dict:
    return next(r for r in json.loads(read_text(path))["runs"] if r["variant"] == variant)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_grid(seq_lens: list[int], heads: int, sms: int) -> tuple[int, int]:
    """(CTAs with work, 32-token tiles they walk) of one layer's stage-1 decode kernel for these per-row lengths."""
    longest, shortest = max(seq_lens), min(seq_lens)
    if longest * 8 < shortest * 10:
        shortest = longest
    chunk_1 = _cdiv(longest, min(_cdiv(longest, shortest), MLA_SPLIT_CAP))
    cores = int(sms * max(math.log2(longest / 64), 1.0))
    head_tiles = _cdiv(heads, HEAD_TILE)
    splits_2 = min(_cdiv(cores, len(seq_lens) * head_tiles), MLA_SPLIT_CAP)
    chunk_2 = _cdiv(longest, splits_2)
    ctas = tiles = 0
    for length in seq_lens:
        splits = max(_cdiv(length, chunk_1), _cdiv(length, chunk_2))
        per_split = _cdiv(_cdiv(length, splits), TILE) * TILE
        busy = _cdiv(length, per_split)
        ctas += head_tiles * busy
        tiles += head_tiles * busy * (per_split // TILE)
    return ctas, tiles


def decode_gap_table() -> list[str]:
    dp, tp2 = _run(DP, "dpattn2-ep2"), _run(TP2, "tp2")
    dp_model, tp2_model = server_model(dp, "H200", 6), server_model(tp2, "H200", 6)
    lines = ["decode step at the same batch, context 256 (ms): DP-attention 2 + EP2 / TP 2, measured and model",
             "      B   DP meas  TP2 meas   gap meas   DP model TP2 model  gap model"]
    tp2_steps = {r["batch_size"]: r["step_ms_median"] for r in tp2["decode"]}
    for row in dp["decode"]:
        b = row["batch_size"]
        if b not in tp2_steps:
            continue
        ctx = b * (row["context_tokens"] + 50)
        m_dp, m_tp = dp_model.decode_step_s(b, ctx) * 1e3, tp2_model.decode_step_s(b, ctx) * 1e3
        lines.append(f"  {b:5d}  {row['step_ms_median']:8.2f}  {tp2_steps[b]:8.2f}  {row['step_ms_median'] - tp2_steps[b]:+9.2f}"
                     f"  {m_dp:9.2f}  {m_tp:9.2f}  {m_dp - m_tp:+9.2f}")
    return lines


def context_table() -> list[str]:
    lines = ["\ncontext points, batch 16 (per GPU: its requests x its heads); kernel grid per layer as SGLang 0.5.17 sets it",
             "  run                                     ctx  graph  step ms  +us/layer     CTAs   tiles W  ns per extra tile and layer (vs the row above)"]
    for label, path, variant, sms, heads, requests in CONTEXT_RUNS:
        run = _run(path, variant)
        captured = sorted(run["derived"]["cuda_graph_decode_bs"])
        graph = captured[bisect.bisect_left(captured, requests)]
        base: tuple[float, int] | None = None
        previous = (0.0, 0)
        for row in run["context"]:
            if not row.get("step_ms_median"):
                continue
            seq = row["context_tokens"] + 50  # mid-way through the 100 decode steps
            ctas, tiles = kv_grid([seq] * requests + [1] * (graph - requests), heads, sms)
            step = row["step_ms_median"]
            if base is None:
                base = previous = (step, tiles)
            extra = (step - base[0]) / 6 * 1e3
            per_tile = (f"{(step - previous[0]) / 6 * 1e6 / (tiles - previous[1]):8.1f}" if tiles > previous[1]
                        else "       -")
            previous = (step, tiles)
            lines.append(f"  {label:38s} {row['context_tokens']:6d} {graph:4d}{' pad' if graph > requests else '    '} "
                         f"{step:7.2f}  {extra:9.1f}  {ctas:7d}  {tiles:8d}  {per_tile}")
    return lines


def main() -> None:
    print("\n".join(decode_gap_table() + context_table()))


if __name__ == "__main__":
    main()
