"""The Qwen3-shaped layer-count probe (issue 25, lease 11; scripts/device/layer_probe.sh with SHAPE=qwen3): the model's
predictions before it ran, and what it measured against them.

    predict   every graphed decode point of the probe's plan at each layer count, as the model prices a Qwen3-shaped step
              today (the roofline with the GPU's cross-shape floor: per step + 44 us per layer), and the fixed time F(L)
              under the two readings the probe decides between (that floor; R1's measured split of lease 8)
    read RAW.json ...   F(L) of each raw file: per graphed point, the measured step less the model's own non-fixed part
              (its reads and compute at that batch and context: the model's step less its floor), the median over the
              points; the least-squares line of F(L) over the counts of one host (per step + per layer); each count's
              distance from the line; the steps against the predictions
    sensitivity  the closed-loop rows (the organisers' 94-layer Qwen3, the two-H100 six-layer pair) at several per-layer
              parts, F(6) held at today's floor

Why this and not lease 8's decode fit: perfmodel/from_raw.py reads MLA shapes only (a Qwen3 raw file has no
kv_lora_rank), and no Qwen3 profile calibrates the model: its Qwen3 step IS the roofline plus the floor, so what the
measured step leaves after the model's non-fixed part is the floor the model would need.

    python3 benchmarks/manifest.py record --out benchmarks/results/2026-11-27-lease11-predicted --stdout layers-output.txt -- \\
        .venv/bin/python benchmarks/qwen3_layer_count.py predict --json benchmarks/results/2026-11-27-lease11-predicted/layers-predicted.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.config.model_presets import MODEL_PRESETS  # noqa: E402
from orchestrator.perfmodel.costmodel import build_cost_model  # noqa: E402
from orchestrator.perfmodel.calibration_lookup import graphed_step_floor  # noqa: E402
from orchestrator.perfmodel.from_raw import gpu_key  # noqa: E402
from orchestrator.perfmodel.gpus import gpu_spec  # noqa: E402
from orchestrator.perfmodel.profile import CalibrationProfile, shipped_profiles  # noqa: E402

PLAN = ROOT / "benchmarks/calibration/plans/lease11-qwen3-layer-grid.json"
QWEN3 = MODEL_PRESETS["qwen3-235b-a22b-fp8"]
GPU = "H100-SXM"
DECODE_PROMPT, DECODE_STEPS, CONTEXT_BATCH = 256, 100, 16  # orchestrator/calibrate/single.py's points
PROBE_LAYERS = (3, 6, 9, 12)
TARGET_LAYERS = QWEN3.num_hidden_layers
# lease 8's R1-shaped split on one H100 (docs/fidelity.md, "The R1-shaped fixed time split by layer count")
R1_SPLIT_S = (0.217e-3, 139.5e-6)
# the probe's server: the lone Qwen3 grid's (qwen3_probe.sh profile phase), SGLang's defaults otherwise
PROBE_SERVER: dict[str, Any] = {"attention_backend": "triton", "context_length": 16384, "page_size": 1, "load_format": "dummy"}


def plan_points() -> list[tuple[int, int]]:
    """(running batch, KV tokens it attends over, mid-way through its 100 steps) of every point the plan measures."""
    (variant,) = json.loads(PLAN.read_text())
    half = DECODE_STEPS // 2
    points = [(b, b * (DECODE_PROMPT + half)) for b in variant["decode_batches"]]
    return points + [(CONTEXT_BATCH, CONTEXT_BATCH * (c + half)) for c in variant["context_lengths"]]


def floor_s(layers: int, gpu: str = GPU) -> float:
    """The fixed time the model charges a graphed Qwen3-shaped step on `gpu` today: the lent floor (calibration_lookup.
    graphed_step_floor, a slope across two layer shapes; the GPU's datasheet pair where none is lent)."""
    lent = graphed_step_floor(gpu, [p for p in shipped_profiles() if p.purpose == "calibration"])
    spec = gpu_spec(gpu)
    step_s, layer_s = lent if lent is not None else (spec.step_overhead_s, spec.layer_overhead_s)
    return step_s + layers * layer_s


def model_step_s(layers: int, batch: int, kv_tokens: int, gpu: str = GPU) -> float:
    model = build_cost_model(replace(QWEN3, num_hidden_layers=layers), gpu, "fp8", **PROBE_SERVER)
    return model.decode_step_s(batch, kv_tokens)


def predict() -> dict:
    rows = []
    for layers in PROBE_LAYERS:
        for batch, kv in plan_points():
            step = model_step_s(layers, batch, kv)
            rows.append({"layers": layers, "batch": batch, "kv_tokens": kv, "model_ms": round(step * 1e3, 4),
                         "non_fixed_ms": round((step - floor_s(layers)) * 1e3, 4),
                         "with_r1_split_ms": round((step - floor_s(layers) + R1_SPLIT_S[0] + layers * R1_SPLIT_S[1]) * 1e3, 4)})
    fixed = {layers: {"cross_shape_floor_ms": round(floor_s(layers) * 1e3, 4),
                      "r1_split_ms": round((R1_SPLIT_S[0] + layers * R1_SPLIT_S[1]) * 1e3, 4)}
             for layers in (*PROBE_LAYERS, TARGET_LAYERS)}
    return {"gpu": GPU, "points": rows, "fixed_ms": fixed}


def measured_points(raw: dict) -> list[tuple[int, int, float]]:
    """(running batch, KV tokens, median step s) of every graphed decode/context point of one raw file, all repeats."""
    out = []
    for run in raw["runs"]:
        for key in ("decode", "context"):
            for row in run.get(key) or []:
                if row.get("step_ms_median") and row.get("cuda_graph") and not row.get("skipped"):
                    batch = int(row.get("running_batch") or row["batch_size"])
                    kv = int(row.get("kv_tokens_median") or batch * (row["context_tokens"] + DECODE_STEPS // 2))
                    out.append((batch, kv, row["step_ms_median"] / 1e3))
    return out


def fixed_of(raw: dict) -> tuple[int, float, float, list[tuple[int, int, float, float]]]:
    """(layers, F = median of measured - the model's non-fixed part, median spread of a point's repeats, points), on
    the raw file's own GPU."""
    layers, gpu = int(raw["model"]["config"]["num_hidden_layers"]), gpu_key(raw["gpu"]["name"])
    points = []
    for batch, kv, step in measured_points(raw):
        non_fixed = model_step_s(layers, batch, kv, gpu) - floor_s(layers, gpu)
        points.append((batch, kv, step, step - non_fixed))
    by_point: dict[tuple[int, int], list[float]] = {}
    for batch, kv, step, _ in points:
        by_point.setdefault((batch, round(kv, -2)), []).append(step)
    spreads = [max(v) - min(v) for v in by_point.values() if len(v) > 1]
    return layers, statistics.median(f for *_, f in points), statistics.median(spreads) if spreads else 0.0, points


def line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (per step, per layer) seconds through (layers, fixed seconds)."""
    x = np.array([[1.0, layers] for layers, _ in points])
    y = np.array([fixed for _, fixed in points])
    (step_s, layer_s), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(step_s), float(layer_s)


def read(raw_paths: list[Path]) -> int:
    raws = [json.loads(p.read_text()) for p in raw_paths]
    gpus = {gpu_key(r["gpu"]["name"]) for r in raws}
    if len(gpus) != 1:
        raise SystemExit(f"raw files of {sorted(gpus)}: one host's GPU at a time")
    gpu = gpus.pop()
    fits = sorted((fixed_of(r) for r in raws), key=lambda f: f[0])
    print(f"on {gpu}: the model's floor today {floor_s(0, gpu) * 1e3:.3f} ms per step + {(floor_s(1, gpu) - floor_s(0, gpu)) * 1e6:.2f} us per layer")
    print(f"{'layers':>6s} {'points':>6s} {'F measured ms':>13s} {'repeat spread ms':>16s} {'floor today ms':>14s} {'R1 split ms':>11s}")
    for layers, fixed, spread, points in fits:
        print(f"{layers:6d} {len(points):6d} {fixed * 1e3:13.3f} {spread * 1e3:16.3f} {floor_s(layers, gpu) * 1e3:14.3f} "
              f"{(R1_SPLIT_S[0] + layers * R1_SPLIT_S[1]) * 1e3:11.3f}")
    print(f"{'layers':>6s} {'batch':>5s} {'kv':>7s} {'measured ms':>11s} {'model ms':>9s} {'error':>6s}")
    for layers, _, _, points in fits:
        for batch, kv, step, _ in points:
            m = model_step_s(layers, batch, kv, gpu)
            print(f"{layers:6d} {batch:5d} {kv:7d} {step * 1e3:11.3f} {m * 1e3:9.3f} {m / step - 1:+6.1%}")
    if len({f[0] for f in fits}) < 2:
        print("fewer than two layer counts: no split", file=sys.stderr)
        return 1
    step_s, layer_s = line([(layers, fixed) for layers, fixed, _, _ in fits])
    print(f"split over {[f[0] for f in fits]} layers: {step_s * 1e3:.3f} ms per step + {layer_s * 1e6:.1f} us per layer "
          f"-> {TARGET_LAYERS} layers {(step_s + TARGET_LAYERS * layer_s) * 1e3:.2f} ms "
          f"(today's floor {floor_s(TARGET_LAYERS, gpu) * 1e3:.2f} ms; R1's split {(R1_SPLIT_S[0] + TARGET_LAYERS * R1_SPLIT_S[1]) * 1e3:.2f} ms)")
    for layers, fixed, spread, _ in fits:
        off = fixed - (step_s + layers * layer_s)
        print(f"  {layers} layers: F {fixed * 1e3:.3f} ms, the line {(step_s + layers * layer_s) * 1e3:.3f} ms, off by "
              f"{off * 1e3:+.3f} ms ({'more' if abs(off) > 2 * spread else 'not more'} than twice the repeats' median spread {spread * 1e3:.3f} ms)")
    return 0


def sensitivity(slopes_us: list[float]) -> None:
    """The closed-loop rows (the organisers' 94-layer Qwen3 on H100, the two-H100 six-layer pair) if a Qwen3-shaped step
    took `b` per layer with F(6) held at today's floor (the six-layer rows then stay put): the H100's floor patched here
    only, for the Qwen3 rows' sake (no other closed-loop row runs on it)."""
    from orchestrator.perfmodel import calibration_lookup as lookup, gpus
    from orchestrator.plan.closedloop import backtest as closed

    saved, lent = gpus.GPU_SPECS[GPU], lookup.graphed_step_floor
    lent_step, lent_layer = lent(GPU, [p for p in shipped_profiles() if p.purpose == "calibration"]) or (0.0, 0.0)
    lent6, spec6 = lent_step + 6 * lent_layer, floor_s(6)

    def patched(b: float) -> Callable[[str, list[CalibrationProfile]], tuple[float, float] | None]:
        return lambda gpu, pool: (lent6 - 6 * b, b) if gpu == GPU else lent(gpu, pool)

    for us in [None, *slopes_us]:
        with contextlib.ExitStack() as patches:
            if us is not None:  # the roofline forwards (prefill) and the lent graphed decode floor, both on the H100
                b = us * 1e-6
                patches.enter_context(mock.patch.dict(gpus.GPU_SPECS, {GPU: replace(saved, step_overhead_s=spec6 - 6 * b,
                                                                                        layer_overhead_s=b)}))
                patches.enter_context(mock.patch.object(lookup, "graphed_step_floor", patched(b)))
            checks = closed._compute_backtest(str(closed.DATASET.resolve()))  # not the disk cache: it keys on files only
        six = lent6
        label = f"today ({lent_layer * 1e6:.2f} us per layer, {lent_step * 1e3:.4f} ms per step)" if us is None else f"{us:g} us per layer, {(six - 6 * us * 1e-6) * 1e3:.3f} ms per step"
        print(f"== {label}: 94 layers {(six + 88 * (lent_layer if us is None else us * 1e-6)) * 1e3:.2f} ms fixed")
        for c in checks:
            if c.row_id.startswith(("organisers", "hdev-h100x2")):
                cells = []
                for k in ("output_tok_s", "ttft_p50_ms", "itl_p50_ms"):
                    err = f" ({c.error(k):+.0%})" if c.measured and k in c.measured else ""
                    cells.append(f"{k} {c.predicted[k]:,.2f}{err}")
                print(f"  {c.row_id:40s} " + "   ".join(cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--json", type=Path, help="also write the predictions here")
    sv = sub.add_parser("sensitivity")
    sv.add_argument("--slopes-us", default="43.98,70,100,139.5", help="per-layer parts to try, comma-separated microseconds")
    r = sub.add_parser("read")
    r.add_argument("raw", nargs="+", type=Path, help="calibration-q3l<L>-lease11.json files of ONE host")
    args = parser.parse_args(argv)
    if args.cmd == "read":
        return read(args.raw)
    if args.cmd == "sensitivity":
        sensitivity([float(x) for x in args.slopes_us.split(",")])
        return 0
    result = predict()
    print(f"== {result['gpu']}: fixed time per graphed Qwen3-shaped decode step (ms)")
    for layers, f in result["fixed_ms"].items():
        print(f"  {layers:2d} layers: the cross-shape floor (today) {f['cross_shape_floor_ms']:7.3f}   R1's split {f['r1_split_ms']:7.3f}")
    print(f"  {'layers':>6s} {'batch':>5s} {'kv':>7s} {'model ms':>9s} {'non-fixed':>9s} {'with R1 split':>13s}")
    for row in result["points"]:
        print(f"  {row['layers']:6d} {row['batch']:5d} {row['kv_tokens']:7d} {row['model_ms']:9.3f} {row['non_fixed_ms']:9.3f} "
              f"{row['with_r1_split_ms']:13.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
