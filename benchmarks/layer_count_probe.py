"""The R1-shaped layer-count probe (issue 25, lease 8; scripts/device/layer_probe.sh): the model's predictions before it
ran, and what it measured against them.

    predict   every point the probe's plan measures at each layer count, as the shipped model's two 61-layer paths price
              it: the calibrated in-node path (the 6-layer profile's whole fixed time per layer) and the roofline (the GPU's
              graphed floor: per step + per layer); and each path's fixed time at the probe's counts and at R1's 61
    sensitivity  the back-test (full runs, points, closed loop) with the split the lease could measure, for several
              per-layer parts (44 us: the roofline's today; 150.6 us: the calibrated path's 6-layer fixed time per layer),
              each applied as the model will apply the measured one (lookup.layer_count_split): the calibrated R1 paths
              keep their profile's fixed time at 6 layers, the roofline's per-step part is each GPU's R1-shaped profiles'
              fixed time less 6 x the slope, and the cited cross-node TP layer cost is re-derived from its public TPOT
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
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.compressed import read_text  # noqa: E402
from orchestrator.config.model_presets import MODEL_PRESETS  # noqa: E402
from orchestrator.perfmodel.calibration_lookup import calibration_for  # noqa: E402
from orchestrator.perfmodel.costmodel import build_cost_model  # noqa: E402
from orchestrator.perfmodel.from_raw import profile_from_raw  # noqa: E402
from orchestrator.perfmodel.gpus import gpu_spec  # noqa: E402

PLAN = ROOT / "benchmarks/calibration/plans/lease8-layer-grid.json"
R1 = MODEL_PRESETS["DeepSeek-R1"]
DECODE_PROMPT, DECODE_STEPS, CONTEXT_BATCH = 256, 100, 16  # orchestrator/calibrate/single.py's points
PROBE_LAYERS = (3, 4, 5, 6)
TARGET_LAYERS = R1.num_hidden_layers
# the probe's server (layer_probe.sh: the 6-layer profiles' flags, SGLang's defaults otherwise)
PROBE_SERVER: dict[str, Any] = {"attention_backend": "triton", "context_length": 16384, "page_size": 1}


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
    return {"calibrated": cal.decode_step_s + layers * cal.decode.layer_s, "roofline": spec.step_overhead_s + layers * spec.layer_overhead_s}


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
    fixed_ms = {layers: {k: round(v * 1e3, 4) for k, v in path_fixed_s(gpu, layers).items()}
                for layers in (*PROBE_LAYERS, TARGET_LAYERS)}
    return {"gpu": gpu, "points": rows, "fixed_ms": fixed_ms}


def fixed_from_raw(raw_paths: list[Path]) -> list[dict]:
    """Each raw file's decode fit on its own graphed points (the one that calibrates the model): its layer count, fixed
    time per graphed step (layers x layer_s), per-request and per-context terms, RMS, and its measured points."""
    out = []
    for path in raw_paths:
        profile = profile_from_raw(json.loads(read_text(path)), raw_dir=str(path.parent), command="layer_probe.sh")
        layers = profile.model.num_hidden_layers
        cal = calibration_for(profile, arch_at(layers), profile.model.quantization)
        if cal.decode is None:
            print(f"{path}: no decode fit (fewer than 2 graphed points, or RMS over the limit)", file=sys.stderr)
            continue
        d = cal.decode
        out.append({"name": profile.name, "layers": layers, "fixed_s": layers * d.layer_s,
                    "per_request_s": layers * d.layer_per_req_s, "per_context_s": layers * d.layer_per_ctx_s,
                    "rms": d.graph_rms_rel, "points": [(p.batch_size, p.context_tokens, p.step_s) for p in profile.decode
                                                       if p.cuda_graph]})
    return out


def read(raw_paths: list[Path], predicted: Path | None) -> int:
    fits = sorted(fixed_from_raw(raw_paths), key=lambda f: f["layers"])
    print(f"{'profile':34s} {'layers':>6s} {'fixed ms':>9s} {'per req us':>10s} {'per 1k ctx us':>13s} {'fit RMS':>7s}")
    for f in fits:
        print(f"{f['name']:34s} {f['layers']:6d} {f['fixed_s'] * 1e3:9.3f} {f['per_request_s'] * 1e6:10.2f} "
              f"{f['per_context_s'] * 1e9:13.2f} {f['rms']:7.1%}")
    if predicted is not None:  # measured steps (median of the repeats) against the pre-registered predictions
        table = {(r["layers"], r["batch"]): r for res in json.loads(predicted.read_text()) if res["gpu"] == "H100-SXM"
                 for r in res["points"] if r["kv_tokens"] == r["batch"] * (DECODE_PROMPT + DECODE_STEPS // 2)}
        print(f"{'layers':>6s} {'batch':>5s} {'measured ms':>11s} {'calibrated':>10s} {'roofline':>9s}")
        for f in fits:
            steps: dict[int, list[float]] = {}
            for batch, ctx, step in f["points"]:
                if ctx < batch * 400:  # the 256-token decode points, not the context ones
                    steps.setdefault(batch, []).append(step)
            for batch, values in sorted(steps.items()):
                row = table.get((f["layers"], batch))
                if row:
                    m = float(np.median(values)) * 1e3
                    print(f"{f['layers']:6d} {batch:5d} {m:11.3f} {row['calibrated_ms']:7.3f} {row['calibrated_ms'] / m - 1:+5.0%}"
                          f" {row['roofline_ms']:6.3f} {row['roofline_ms'] / m - 1:+5.0%}")
    counted = [f for f in fits if f["layers"] > 3]  # pre-registered: counts with MoE layers split; 3 (dense) checks
    if len({f["layers"] for f in counted}) < 2:
        print("fewer than two layer counts with MoE layers: no split", file=sys.stderr)
        return 1
    step_s, layer_s = line([(f["layers"], f["fixed_s"]) for f in counted])
    print(f"split over {sorted(f['layers'] for f in counted)} layers: {step_s * 1e3:.3f} ms per step + "
          f"{layer_s * 1e6:.1f} us per layer -> {TARGET_LAYERS} layers {(step_s + TARGET_LAYERS * layer_s) * 1e3:.2f} ms")
    for f in fits:
        print(f"  {f['layers']} layers: fixed {f['fixed_s'] * 1e3:.3f} ms, the line {(step_s + f['layers'] * layer_s) * 1e3:.3f} ms")
    return 0


def line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (per step, per layer) seconds through (layers, fixed seconds)."""
    x = np.array([[1.0, layers] for layers, _ in points])
    y = np.array([fixed for _, fixed in points])
    (step_s, layer_s), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(step_s), float(layer_s)


def with_split(layer_s: float):
    """Patch the model as a measured per-layer slope `layer_s` would set it (returns an undo function)."""
    from orchestrator.perfmodel import calibration_lookup as lookup, gpus
    from orchestrator.perfmodel.parallel import collectives
    from orchestrator.perfmodel.profile import shipped_profiles

    r1_shape = next(p.model for p in shipped_profiles() if p.model.matches(R1, "fp8"))
    saved = (lookup.layer_count_split, dict(gpus.GPU_SPECS), dict(collectives.PUBLISHED))
    lookup.layer_count_split = lambda gpu, pool, *shape: (layer_s, r1_shape)
    for name in ("H100-SXM", "H200"):
        floor = lookup.graphed_step_floor(name, shipped_profiles())
        assert floor is not None
        gpus.GPU_SPECS[name] = replace(gpus.GPU_SPECS[name], step_overhead_s=floor[0], layer_overhead_s=floor[1])
    # the cross-node TP layer cost: the public single-stream TP16 TPOT (23.1 ms) beyond the model's own batch-1 step
    no_layer = replace(collectives.HOPPER, inter_tp_layer_s=None)
    collectives.PUBLISHED.update({"H100-SXM": no_layer, "H200": no_layer})
    m = build_cost_model(R1, "H100-SXM", "fp8", calibrated=True, tp=16, nnodes=2, load_format="auto")
    inter = (23.1e-3 - m.decode_step_s(1, 128 + 64)) / TARGET_LAYERS
    cited = replace(collectives.HOPPER, inter_tp_layer_s=inter)
    collectives.PUBLISHED.update({"H100-SXM": cited, "H200": cited})

    def undo() -> None:
        lookup.layer_count_split = saved[0]
        gpus.GPU_SPECS.clear()
        gpus.GPU_SPECS.update(saved[1])
        collectives.PUBLISHED.clear()
        collectives.PUBLISHED.update(saved[2])
    return undo, inter


def sensitivity(slopes_us: list[float]) -> None:
    from orchestrator.plan.backtest.predict import run_backtest
    from orchestrator.plan.backtest.report import summary
    from orchestrator.plan.closedloop import backtest as closed

    def one(label: str) -> None:
        rows = run_backtest()
        checks = closed._compute_backtest(str(closed.DATASET.resolve()))  # not the disk cache: it keys on files only
        print(f"== {label}")
        for text in summary(rows).splitlines():
            if text.startswith("MAPE"):
                print("  " + text)
        for r in rows:
            if r.kind == "throughput" and r.scope == "run" and r.sample == "out":
                print(f"    {r.id:58s} {float(r.error or 0):+7.1%}")
        for c in checks:
            if c.measured is not None:
                print(f"    {c.row_id:44s} " + "  ".join(f"{k} {c.error(k):+.0%}" for k in ("output_tok_s", "itl_p50_ms", "ttft_p50_ms")
                                                       if k in c.measured))

    one("the model as shipped")
    for us in slopes_us:
        undo, inter = with_split(us * 1e-6)
        try:
            floors = {g: (gpu_spec(g).step_overhead_s * 1e3, gpu_spec(g).layer_overhead_s * 1e6) for g in ("H100-SXM", "H200")}
            one(f"per-layer {us:.1f} us: floor H100 {floors['H100-SXM'][0]:.3f} ms, H200 {floors['H200'][0]:.3f} ms per step; "
                f"cross-node TP layer {inter * 1e6:.0f} us; 61-layer calibrated fixed H100 "
                f"{path_fixed_s('H100-SXM', TARGET_LAYERS)['calibrated'] * 1e3:.2f} ms, H200 "
                f"{path_fixed_s('H200', TARGET_LAYERS)['calibrated'] * 1e3:.2f} ms")
        finally:
            undo()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--gpu", action="append", help="cost-model GPU key (default: H100-SXM and H200)")
    p.add_argument("--json", type=Path, help="also write the predictions here")
    sv = sub.add_parser("sensitivity")
    sv.add_argument("--slopes-us", default="44,100,150.6", help="per-layer parts to try, comma-separated microseconds")
    r = sub.add_parser("read")
    r.add_argument("raw", nargs="+", type=Path, help="calibration-r1s<L>-lease8.json[.xz] files of ONE host")
    r.add_argument("--predicted", type=Path, help="the pre-registered predictions.json to hold the steps against")
    args = parser.parse_args(argv)
    if args.cmd == "sensitivity":
        sensitivity([float(x) for x in args.slopes_us.split(",")])
        return 0
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
    return read(args.raw, args.predicted)


if __name__ == "__main__":
    sys.exit(main())
