"""Lease 3's same-host A/Bs on one two-H100 machine (issue 25), read from the raw files against the model (no fit).

1. Eager decode, TP 1 (GPU 0) vs TP 2 (both GPUs), the R1 layer shape x 6 layers, --disable-cuda-graph, the same
   points (batch 1 ... 512 at context 256, batch 16 at context 256 / 2,048 / 8,192), each point twice in a row:
   the logged step (harness estimator) of the first use and of the warm repeat, TP 2 - TP 1, and the planner's
   eager step for each (decode_step_s: max(graph replay, CPU launch), plus TP 2's per-layer eager cost), beside the
   second lease's TP 2 eager steps on a two-H200 machine.
2. The same points' client walls (100 decode steps + the prompts' prefill): first use vs warm repeat, the logged
   steps' share (100 x step), and the prefill tokens SGLang logged (one fewer than sent = a radix-cache hit).
3. PD pair vs one aggregated TP 2 server through the product, measured on this machine against the predictions
   recorded before the lease (benchmarks/results/2026-11-26-lease3-predicted/predicted.json).
4. The per-layer TP > 1 eager cost fitted on section 1 (htp2): the mean over the warm decode points measured at both
   TP sizes of (TP 2 - TP 1) / layers, beside the figure the model ships (collectives.HOPPER.eager_tp_layer_s).

Usage (repo root; no GPU):  .venv/bin/python benchmarks/same_host_ab.py
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.compressed import read_text  # noqa: E402
from orchestrator.config.model_presets import DEEPSEEK_R1  # noqa: E402
from orchestrator.observe.report import TOTAL_THROUGHPUT_LABEL, total_throughputs  # noqa: E402
from orchestrator.perfmodel.costmodel import build_cost_model  # noqa: E402
from orchestrator.perfmodel.parallel.collectives import HOPPER  # noqa: E402

LEASE3 = ROOT / "benchmarks/results/2026-11-26-two-gpu-lease3-h100x2"
TP1 = LEASE3 / "call3-tp1-eager-graphpad/calibration-r1s6-tp1-eager.json.xz"
TP2 = LEASE3 / "call2-tp2-eager/calibration-twogpu-eager.json.xz"
TP2_LEASE2 = ROOT / "benchmarks/results/2026-11-26-two-gpu-lease2-h200x2/call5-calibration/calibration-twogpu-extra.json.xz"
PD_LOG, AGG_LOG = LEASE3 / "call4-pd/main-pd.log", LEASE3 / "call5-agg/main-agg.log"
PREDICTED = ROOT / "benchmarks/results/2026-11-26-lease3-predicted/predicted.json"
PD_ROW, AGG_ROW = "h100x2-v2lite-pd-product-mem065-lease3", "h100x2-v2lite-agg-tp2-mem080-product-lease3"
STEPS = 100
LAYERS = 6  # the R1 layer shape's count in both servers


def points(path: Path, variant: str) -> dict[tuple[str, int, int, int], dict]:
    """(measure, batch, context, repeat) -> the raw row, for the decode and context points of one run."""
    run = next(r for r in json.loads(read_text(path))["runs"] if r["variant"] == variant)
    return {(m, r["batch_size"], r["context_tokens"], r.get("repeat", 0)): r
            for m in ("decode", "context") for r in run.get(m) or []}


def eager_model(tp: int):
    shape = replace(DEEPSEEK_R1, num_hidden_layers=6, first_k_dense_replace=3)
    return build_cost_model(shape, "H100-SXM", "fp8", attention_backend="triton", load_format="dummy", tp=tp,
                            context_length=16384, cuda_graph=False, mem_fraction_static=0.7)


def _ms(row: dict | None) -> str:
    step = (row or {}).get("step_ms_median")
    return f"{step:6.2f}" if step else "     -"


def step_table(tp1: dict, tp2: dict, lease2: dict) -> list[str]:
    m1, m2 = eager_model(1), eager_model(2)
    lines = ["1. eager decode step (ms; logged, median of the point's lines): first use / warm repeat",
             "   point            TP1 first  TP1 warm  TP2 first  TP2 warm  TP2-TP1 warm  model TP1  model TP2  model TP2-TP1"
             "  lease-2 TP2 (2xH200)"]
    for key in sorted({k[:3] for k in tp2}, key=lambda k: (k[0] != "decode", k[1], k[2])):
        measure, b, c = key
        r1, r2 = tp1.get((*key, 1)), tp2.get((*key, 1))
        diff = (f"{r2['step_ms_median'] - r1['step_ms_median']:+12.2f}"
                if r1 and r2 and r1.get("step_ms_median") and r2.get("step_ms_median") else "           -")
        p1, p2 = m1.decode_step_s(b, b * (c + 50)) * 1e3, m2.decode_step_s(b, b * (c + 50)) * 1e3
        lines.append(f"   {measure:7s} {b:3d} x {c:5d}  {_ms(tp1.get((*key, 0)))}    {_ms(r1)}     {_ms(tp2.get((*key, 0)))}    "
                     f"{_ms(r2)}  {diff}     {p1:6.2f}     {p2:6.2f}         {p2 - p1:+6.2f}            {_ms(lease2.get((*key, 0)))}")
    return lines


def wall_table(tp1: dict, tp2: dict) -> list[str]:
    lines = ["\n2. client wall (s) of each point: first use / warm repeat; 100 x the logged step; prefill tokens logged of sent",
             "   point            server  wall first  wall warm  100 x step warm  prefill tokens first / warm (sent)"]
    for key in sorted({k[:3] for k in tp2}, key=lambda k: (k[0] != "decode", k[1], k[2])):
        for label, pts in (("TP1", tp1), ("TP2", tp2)):
            first, warm = pts.get((*key, 0)), pts.get((*key, 1))
            if not first or not warm:
                continue
            sent = warm["client"].get("input_tokens")
            step = warm.get("step_ms_median")
            lines.append(f"   {key[0]:7s} {key[1]:3d} x {key[2]:5d}  {label}    {first['client']['wall_s']:9.2f}  "
                         f"{warm['client']['wall_s']:9.2f}  {STEPS * step / 1e3 if step else float('nan'):15.2f}  "
                         f"{first.get('prefill_tokens_logged')} / {warm.get('prefill_tokens_logged')} ({sent})"
                         + ("" if warm["client"]["ok"] == warm["client"]["n"] else f"  FAILED {warm['client']['errors'][:1]}"))
    return lines


def total_tok_s(log: Path) -> float:
    totals = total_throughputs(log.read_text())
    if len(totals) != 1:
        raise SystemExit(f"{log}: {len(totals)} '{TOTAL_THROUGHPUT_LABEL}' lines, expected one bench result block")
    return totals[0]


def pd_vs_agg() -> list[str]:
    predicted = json.loads(PREDICTED.read_text())["rows"]
    pd, agg = total_tok_s(PD_LOG), total_tok_s(AGG_LOG)
    p_pd, p_agg = predicted[PD_ROW]["total_tok_s"], predicted[AGG_ROW]["total_tok_s"]
    return ["\n3. PD pair (decode mem 0.65) vs one aggregated TP 2 server (mem 0.80), V2-Lite shape, 1000 ShareGPT prompts, "
            "this machine",
            f"   PD          measured {pd:8,.0f} total tok/s, predicted before the lease {p_pd:8,.0f} ({p_pd / pd - 1:+.1%})",
            f"   aggregated  measured {agg:8,.0f} total tok/s, predicted before the lease {p_agg:8,.0f} ({p_agg / agg - 1:+.1%})",
            f"   PD / aggregated: measured x{pd / agg:.3f}, predicted x{p_pd / p_agg:.3f}"]


def tp_layer_gaps_ms(tp1: dict, tp2: dict) -> dict[int, float]:
    """batch -> (TP 2 - TP 1) logged step per layer, ms, over the warm decode points measured at both TP sizes."""
    gaps = {}
    for key, r2 in tp2.items():
        r1 = tp1.get(key)
        if key[0] == "decode" and key[3] == 1 and r1 and r1.get("step_ms_median") and r2.get("step_ms_median"):
            gaps[key[1]] = (r2["step_ms_median"] - r1["step_ms_median"]) / LAYERS
    return dict(sorted(gaps.items()))


def tp_layer_fit(tp1: dict, tp2: dict) -> list[str]:
    gaps = tp_layer_gaps_ms(tp1, tp2)
    mean = sum(gaps.values()) / len(gaps)
    shipped = HOPPER.eager_tp_layer_s or 0.0
    return ["\n4. per-layer TP > 1 eager cost: (TP 2 - TP 1) / 6 layers of each warm decode point (ms)",
            "   " + "  ".join(f"B={b}: {g:.3f}" for b, g in gaps.items()),
            f"   mean {mean:.3f} ms per layer over {len(gaps)} points (range {min(gaps.values()):.3f}-{max(gaps.values()):.3f}); "
            f"shipped collectives.HOPPER.eager_tp_layer_s {shipped * 1e3:.3f} ms"]


def main() -> int:
    tp1, tp2 = points(TP1, "tp1-eager"), points(TP2, "tp2-eager")
    print("\n".join(step_table(tp1, tp2, points(TP2_LEASE2, "tp2-eager")) + wall_table(tp1, tp2) + pd_vs_agg()
                    + tp_layer_fit(tp1, tp2)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
