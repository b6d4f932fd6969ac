"""The R1-shaped layer-count probe (issue 25, lease 8; scripts/device/layer_probe.sh): the model's predictions before it
ran, and what it measured against them.

    predict   every point the probe's plan measures at each layer count, as the shipped model's two 61-layer paths price
              it: the calibrated in-node path (the 6-layer profile's whole fixed time per layer) and the roofline (the GPU's
              graphed floor: per step + per layer); and each path's fixed time at the probe's counts and at R1's 61
    read RAW.json ...   the fixed time F(L) each raw file's graphed steps leave after their reads (the decode fit that
              calibrates the model, on that count's points), its least-squares line over the counts measured on one
              host (per step + per layer), and the 61-layer fixed time each way

    python3 benchmarks/manifest.py record --out benchmarks/results/2026-11-27-lease8-predicted --stdout output.txt -- \\
        .venv/bin/python benchmarks/layer_count_probe.py predict
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.config.model_presets import MODEL_PRESETS  # noqa: E402
from orchestrator.perfmodel.costmodel import build_cost_model, calibration_for  # noqa: E402
from orchestrator.perfmodel.from_raw import profile_from_raw  # noqa: E402
from orchestrator.perfmodel.gpus import gpu_spec  # noqa: E402

PLAN = ROOT / "benchmarks/calibration/plans/lease8-layer-grid.json"
R1 = MODEL_PRESETS["DeepSeek-R1"]
DECODE_PROMPT, DECODE_STEPS, CONTEXT_BATCH = 256, 100, 16  # orchestrator/calibrate/single.py's points
PROBE_LAYERS = (3, 4, 5, 6)
TARGET_LAYERS = R1.num_hidden_layers
# the probe's server (layer_probe.sh: the 6-layer profiles' flags, SGLang's defaults otherwise)
PROBE_SERVER = {"attention_backend": "triton", "context_length": 16384, "page_size": 1}


def plan_points() -> list[tuple[int, int]]:
    """(running batch, KV tokens it attends over, mid-way through its 100 steps) of every point the plan measures."""
    (variant,) = json.loads(PLAN.read_text())
    half = DECODE_STEPS // 2
    points = [(b, b * (DECODE_PROMPT + half)) for b in variant["decode_batches"]]
    return points + [(CONTEXT_BATCH, CONTEXT_BATCH * (c + half)) for c in variant["context_lengths"]]


def arch_at(layers: int):
    return replace(R1, num_hidden_layers=layers)


def path_fixed_s(gpu: str, layers: int) -> dict[str, float]:
    """Each path's fixed time of one graphed decode step at `layers` R1 layers on one GPU."""
    cal = build_cost_model(arch_at(layers), gpu, "fp8", calibrated=True, load_format="dummy", **PROBE_SERVER).calibration
    assert cal is not None and cal.decode is not None, f"no calibrated R1 decode fit on {gpu}"
    spec = gpu_spec(gpu)
    return {"calibrated": layers * cal.decode.layer_s, "roofline": spec.step_overhead_s + layers * spec.layer_overhead_s}


def predict(gpu: str) -> dict:
    rows = []
    for layers in PROBE_LAYERS:
        calibrated = build_cost_model(arch_at(layers), gpu, "fp8", calibrated=True, load_format="dummy", **PROBE_SERVER)
        roofline = build_cost_model(arch_at(layers), gpu, "fp8", calibrated=False, load_format="dummy", **PROBE_SERVER)
        fixed = path_fixed_s(gpu, layers)
        for batch, ctx in plan_points():
            cal_s, roof_s = calibrated.decode_step_s(batch, ctx), roofline.decode_step_s(batch, ctx)
            rows.append({"layers": layers, "batch": batch, "kv_tokens": ctx, "calibrated_ms": round(cal_s * 1e3, 4),
                         "roofline_ms": round(roof_s * 1e3, 4),
                         # the calibrated path's reads and per-request terms with the roofline's fixed time instead
                         "calibrated_with_split_floor_ms": round((cal_s - fixed["calibrated"] + fixed["roofline"]) * 1e3, 4)})
    fixed = {layers: {k: round(v * 1e3, 4) for k, v in path_fixed_s(gpu, layers).items()}
             for layers in (*PROBE_LAYERS, TARGET_LAYERS)}
    return {"gpu": gpu, "points": rows, "fixed_ms": fixed}


def fixed_from_raw(raw_paths: list[Path]) -> list[tuple[int, float, str]]:
    """(layers, fixed seconds per graphed step, name) of each raw file: its decode fit's layers x layer_s."""
    out = []
    for path in raw_paths:
        profile = profile_from_raw(json.loads(path.read_text()), raw_dir=str(path.parent), command="layer_probe.sh")
        cal = calibration_for(profile, arch_at(profile.model.num_hidden_layers), profile.model.quantization)
        if cal.decode is None:
            print(f"{path}: no decode fit (fewer than 2 graphed points, or RMS over the limit)", file=sys.stderr)
            continue
        out.append((profile.model.num_hidden_layers, profile.model.num_hidden_layers * cal.decode.layer_s, profile.name))
    return out


def line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (per step, per layer) seconds through (layers, fixed seconds)."""
    x = np.array([[1.0, layers] for layers, _ in points])
    y = np.array([fixed for _, fixed in points])
    (step_s, layer_s), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(step_s), float(layer_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--gpu", action="append", help="cost-model GPU key (default: H100-SXM and H200)")
    p.add_argument("--json", type=Path, help="also write the predictions here")
    r = sub.add_parser("read")
    r.add_argument("raw", nargs="+", type=Path, help="calibration-r1s<L>-lease8.json files of ONE host")
    args = parser.parse_args(argv)
    if args.cmd == "predict":
        result = [predict(gpu) for gpu in args.gpu or ["H100-SXM", "H200"]]
        for res in result:
            print(f"== {res['gpu']}: fixed time per graphed step (ms), each path")
            for layers, f in res["fixed_ms"].items():
                print(f"  {layers:2d} layers: calibrated {f['calibrated']:7.3f}   roofline {f['roofline']:7.3f}")
            print(f"  {'layers':>6s} {'batch':>5s} {'kv':>7s} {'calibrated':>10s} {'roofline':>9s} {'cal+split':>9s}")
            for row in res["points"]:
                print(f"  {row['layers']:6d} {row['batch']:5d} {row['kv_tokens']:7d} {row['calibrated_ms']:10.3f} "
                      f"{row['roofline_ms']:9.3f} {row['calibrated_with_split_floor_ms']:9.3f}")
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
        return 0
    measured = fixed_from_raw(args.raw)
    for layers, fixed, name in sorted(measured):
        print(f"{name}: {layers} layers, fixed {fixed * 1e3:.3f} ms per graphed step")
    if len({layers for layers, _, _ in measured}) < 2:
        print("one layer count: no split", file=sys.stderr)
        return 1
    step_s, layer_s = line([(layers, fixed) for layers, fixed, _ in measured])
    print(f"split: {step_s * 1e3:.3f} ms per step + {layer_s * 1e6:.1f} us per layer "
          f"-> {TARGET_LAYERS} layers {(step_s + TARGET_LAYERS * layer_s) * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
