"""The Triton GQA decode attention's context latency (issue 25, hctx): the per-iteration cost read from lease 14's raw
files, and every committed Qwen3-shaped grid that ran one batch at two or more contexts against the form
(orchestrator/perfmodel/server/triton_gqa.py): a decode layer's attention = max(KV bytes at the read rate, one
program's 32-token iterations x the per-iteration cost).

    .venv/bin/python benchmarks/triton_gqa_context.py

1. the launch geometry SGLang 0.5.17 gives each grid point (splits, programs, iterations a program walks)
2. the per-iteration cost: lease 14's 94- and 48-layer files (TP 4 x EP 4, one KV head a GPU), batch 1-12, where the
   KV bytes are under a fifth of the latency at 4,096: step(4,096) - step(256), per layer, per added iteration; the
   median over those pairs is TRITON_GQA_ITERATION_S (the 12-layer file is left out: its batch 1-4 steps sit at the
   scheduler's floor, ~2.1-2.3 ms whatever the context, as the read says)
3. every grid's context growth per layer at each batch: measured, the bytes alone (the model before), the form
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.compressed import read_text  # noqa: E402
from orchestrator.config.model_presets import MODEL_PRESETS  # noqa: E402
from orchestrator.perfmodel.gpus import gpu_spec  # noqa: E402
from orchestrator.perfmodel.server.forward import WEIGHT_READ_EFFICIENCY  # noqa: E402
from orchestrator.perfmodel.server.triton_gqa import (  # noqa: E402
    TRITON_GQA_ITERATION_S, head_tiles, kv_splits, loop_iterations)

RESULTS = ROOT / "benchmarks/results"
QWEN3 = MODEL_PRESETS["qwen3-235b-a22b-fp8"]
LEASE14 = RESULTS / "2026-11-27-lease14-h200x4"
# (name, raw file, GPU, layers, TP: attention heads split over it)
GRIDS = [
    ("lease 14, 94 layers, TP 4", LEASE14 / "call4-probe94/calibration-q3l94-tp4ep4-lease14.json", "H200", 94, 4),
    ("lease 14, 48 layers, TP 4", LEASE14 / "call6-probe48/calibration-q3l48-tp4ep4-lease14.json", "H200", 48, 4),
    ("lease 14, 12 layers, TP 4", LEASE14 / "call5-probe12/calibration-q3l12-tp4ep4-lease14.json", "H200", 12, 4),
    ("lease 3 lone H100, 6 layers, TP 1",
     RESULTS / "2026-11-26-two-gpu-lease3-h100x2/call6-qwen3-probe/calibration-qwen3-l6.json.xz", "H100-SXM", 6, 1),
    ("lone H200, 6 layers, TP 1",
     RESULTS / "2026-11-26-qwen3-h200-lone/call2-profile/calibration-qwen3-l6.json.xz", "H200", 6, 1),
]
CALIBRATION_GRIDS = (0, 1)  # the 94- and 48-layer files
CALIBRATION_BATCH_MAX = 12
DECODE_STEPS_HALF = 50  # calibrate single runs 100 steps a point: the median request is 50 tokens past its prompt


def rows(path: Path) -> dict[tuple[int, int, int], tuple[float, int]]:
    """(batch, context, repeat) -> (step s, tokens a request holds mid-point) of the graphed decode rows."""
    out = {}
    for run in json.loads(read_text(path))["runs"]:
        for r in run.get("decode") or []:
            if r.get("step_ms_median") and not r.get("skipped") and r.get("cuda_graph"):
                batch = int(r.get("running_batch") or r["batch_size"])
                kv = r.get("kv_tokens_median") or batch * (r["context_tokens"] + DECODE_STEPS_HALF)
                out[(batch, r["context_tokens"], r.get("repeat", 0))] = (r["step_ms_median"] / 1e3, round(kv / batch))
    return out


def heads(tp: int) -> tuple[int, int]:
    return QWEN3.num_attention_heads // tp, max(1, QWEN3.num_key_value_heads // tp)


def geometry(seq_len: int, batch: int, tp: int, sms: int) -> tuple[int, int, int]:
    """(splits, programs, iterations a program walks) of one layer's stage-1 launch."""
    q, kv = heads(tp)
    splits = kv_splits(seq_len, batch, q, kv, sms)
    return splits, batch * head_tiles(q, kv) * splits, loop_iterations(seq_len, splits)


def bytes_s(seq_len: int, batch: int, tp: int, gpu: str) -> float:
    """One layer's KV read of the batch at the model's read rate (bf16 K and V of this GPU's KV heads)."""
    _, kv = heads(tp)
    nbytes = batch * seq_len * 2 * kv * QWEN3.head_dim * 2
    return nbytes / (gpu_spec(gpu).hbm_tb_s * 1e12 * WEIGHT_READ_EFFICIENCY)


def layer_s(seq_len: int, batch: int, tp: int, gpu: str, per_iteration_s: float) -> float:
    """The form: one layer's attention = max(bytes, iterations x per-iteration cost)."""
    _, _, iters = geometry(seq_len, batch, tp, gpu_spec(gpu).sm_count)
    return max(bytes_s(seq_len, batch, tp, gpu), iters * per_iteration_s)


def context_pairs(grid: tuple) -> list[tuple[int, int, int, float, int, int]]:
    """(batch, short context, long context, measured growth s per layer (median of repeats), short, long tokens)."""
    _, path, _, layers, _ = grid
    r = rows(path)
    out = []
    for batch in sorted({b for b, _, _ in r}):
        contexts = sorted({c for b, c, _ in r if b == batch})
        for lo, hi in zip(contexts, contexts[1:]):
            reps = sorted({k for b, c, k in r if b == batch and c == lo} & {k for b, c, k in r if b == batch and c == hi})
            if not reps:
                continue
            growth = statistics.median((r[(batch, hi, k)][0] - r[(batch, lo, k)][0]) / layers for k in reps)
            out.append((batch, lo, hi, growth, r[(batch, lo, reps[0])][1], r[(batch, hi, reps[0])][1]))
    return out


def per_iteration_samples() -> list[float]:
    """Step growth per layer per added iteration of every (batch <= 12, repeat) pair of the calibration files."""
    samples = []
    for i in CALIBRATION_GRIDS:
        _, path, gpu, layers, tp = GRIDS[i]
        r = rows(path)
        for (batch, ctx, rep), (step_hi, hi) in sorted(r.items()):
            if batch > CALIBRATION_BATCH_MAX or ctx != 4096 or (batch, 256, rep) not in r:
                continue
            step_lo, lo = r[(batch, 256, rep)]
            sms = gpu_spec(gpu).sm_count
            added = geometry(hi, batch, tp, sms)[2] - geometry(lo, batch, tp, sms)[2]
            samples.append((step_hi - step_lo) / layers / added)
    return samples


def main() -> int:
    samples = per_iteration_samples()
    read = statistics.median(samples)
    print("1. launch geometry (SGLang 0.5.17 get_num_kv_splits_triton, _decode_grouped_att_m_fwd; 132 SMs):")
    print("   TP  batch  tokens  splits  programs  iterations")
    for tp in (4, 1):
        for batch in (1, 4, 16, 64, 256):
            for tokens in (306, 1074, 4146):
                s, p, it = geometry(tokens, batch, tp, 132)
                print(f"  {tp:3d} {batch:6d} {tokens:7d} {s:7d} {p:9d} {it:11d}")
    print(f"\n2. per-iteration cost: {len(samples)} pairs (lease 14, 94 and 48 layers, batch 1-{CALIBRATION_BATCH_MAX}, "
          f"context 256 -> 4,096, each repeat): median {read * 1e6:.2f} us, spread {min(samples) * 1e6:.2f}-"
          f"{max(samples) * 1e6:.2f} us; TRITON_GQA_ITERATION_S = {TRITON_GQA_ITERATION_S * 1e6:.2f} us "
          f"({'matches' if abs(read - TRITON_GQA_ITERATION_S) < 0.01e-6 else 'DIFFERS'})")
    print("\n3. context growth per layer (us), measured vs the bytes alone (the model before) vs the form "
          "max(bytes, iterations x cost); * = a calibration pair")
    for i, grid in enumerate(GRIDS):
        name, _, gpu, _, tp = grid
        print(f"  {name} ({gpu}):")
        print("    batch   contexts   iterations  programs(long)  measured   bytes    form  form err")
        errs = []
        for batch, lo_c, hi_c, growth, lo, hi in context_pairs(grid):
            sms = gpu_spec(gpu).sm_count
            g_lo, g_hi = geometry(lo, batch, tp, sms), geometry(hi, batch, tp, sms)
            b = bytes_s(hi, batch, tp, gpu) - bytes_s(lo, batch, tp, gpu)
            form = layer_s(hi, batch, tp, gpu, read) - layer_s(lo, batch, tp, gpu, read)
            err = form / growth - 1 if growth > 0 else float("nan")
            errs.append(abs(form - growth))
            mark = "*" if i in CALIBRATION_GRIDS and batch <= CALIBRATION_BATCH_MAX else " "
            print(f"   {batch:5d}{mark} {lo_c:5d}->{hi_c:<5d} {g_lo[2]:4d}->{g_hi[2]:<4d}  {g_hi[1]:13d}  "
                  f"{growth * 1e6:8.1f} {b * 1e6:7.1f} {form * 1e6:7.1f}  {err:+8.0%}")
        print(f"    median |form - measured| {statistics.median(errs) * 1e6:.1f} us per layer over {len(errs)} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
