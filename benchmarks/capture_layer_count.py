"""Warm decode CUDA-graph capture against the layer count, R1-shaped, one host (issue 25, lease 20;
scripts/device/layer_probe.sh with benchmarks/calibration/plans/lease20-capture-layers.json: two starts per count).

    predict   every start of the call (the first cold, the rest warm) as three forms of warm capture price it, at the
              probe's 36 graph sizes: per size x layer (the model today: the R1-shaped profile's 45.8 ms x sizes x
              layers), per size flat (the profile's own 6-layer capture per size at any count), and the affine a + b L
              per size through lease 8's warm H100 starts (3 / 5 / 6 layers); and R1's 61 layers at 52 sizes each way
    read RAW.json ... --logs TAR   each start's capture, sizes and first size (from the server logs in the probe's
              archive, SGLang's progress bar: >= 30 s is a compile, so a cold start), the least-squares line of warm
              capture per size over the layer count, the share f = a / (a + 6 b) of a size's 6-layer capture that does
              not grow with the layers, and the outcome class of the pre-registered rule
              (benchmarks/results/2026-11-27-lease20-predicted/README.md)

    python3 benchmarks/manifest.py record --out benchmarks/results/2026-11-27-lease20-predicted --stdout output.txt -- \\
        .venv/bin/python benchmarks/capture_layer_count.py predict --json benchmarks/results/2026-11-27-lease20-predicted/predicted.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.compressed import read_text  # noqa: E402
from orchestrator.config.model_presets import MODEL_PRESETS  # noqa: E402
from orchestrator.perfmodel.costmodel import build_cost_model  # noqa: E402

R1 = MODEL_PRESETS["DeepSeek-R1"]
PROBE_SIZES = 36  # SGLang 0.5.17's default decode graphs on one H100 or H200 (1..256)
R1_SIZES = 52  # R1 FP8 at TP 8 (graphs to 512): the planning examples' server
PROFILE_LAYERS = 6  # the R1-shaped profiles' layer count
PROBE_SERVER: dict[str, Any] = {"attention_backend": "triton", "context_length": 16384, "page_size": 1}
# lease 8's warm R1-shaped starts on one H100 (benchmarks/results/2026-11-27-lease8-r1-layers-h100: capture s, 36 sizes)
LEASE8_WARM = ((3, 2.5), (5, 4.85), (6, 14.46))
COLD_FIRST_SIZE_S = 30.0  # benchmarks/startup_capture_by_shape.py: a first size that long compiled its kernels
PROPORTIONAL_MAX_F, FLAT_MIN_F = 0.2, 0.8  # the rule's classes of f (README of the -predicted folder)
_FIRST = re.compile(r"Capturing batches \(bs=\d+[^|]*\|[^|]*\|\s+1/(\d+) \[[\d:]+<[^,]*,\s+([\d.]+)(s/it|it/s)\]")
_END = re.compile(r"Capture (.*?)CUDA graph end\. elapsed=([\d.]+) s")  # orchestrator/calibrate/logparse.py


def line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (a, b) of y = a + b x."""
    x, y = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def share_fixed(a: float, b: float) -> float:
    """f: the part of a size's capture at the profile's 6 layers that does not grow with the layers."""
    return a / (a + PROFILE_LAYERS * b)


def outcome(f: float) -> str:
    if f < 0:
        return "faster than proportional: per size x layer kept (no superlinear form is adopted on one lease)"
    if f <= PROPORTIONAL_MAX_F:
        return "per size x layer kept (today's form)"
    if f >= FLAT_MIN_F:
        return "per size flat: a size's capture at the profile's own layer count, at any count"
    return f"affine per size: the profile's capture per size x ({f:.2f} + {1 - f:.2f} x L / {PROFILE_LAYERS})"


def startup_terms(gpu: str, layers: int) -> dict[str, float]:
    model = build_cost_model(replace(R1, num_hidden_layers=layers), gpu, "fp8", calibrated=True, load_format="dummy",
                             **PROBE_SERVER)
    st = model.calibration.startup if model.calibration is not None else None
    assert st is not None and st.graph_bs_layer_s is not None, f"no R1-shaped start-up figures for {gpu}"
    warm = model.startup_breakdown_s(jit_cached=True, graph_sizes=PROBE_SIZES)
    cold = model.startup_breakdown_s(jit_cached=False, graph_sizes=PROBE_SIZES)
    return {"per_bs_layer_s": st.graph_bs_layer_s, "warm_rest_s": sum(warm.values()) - warm["cuda_graphs"],
            "cold_rest_s": sum(cold.values()) - PROBE_SIZES * layers * st.graph_bs_layer_s}


def predict(gpu: str, layers_order: list[int]) -> dict:
    a8, b8 = line([(n, s / PROBE_SIZES) for n, s in LEASE8_WARM])
    rows = []
    for i, (layers, start) in enumerate((n, k) for n in layers_order for k in (1, 2)):
        t = startup_terms(gpu, layers)
        per_size = {"per size x layer": t["per_bs_layer_s"] * layers,
                    "per size flat": t["per_bs_layer_s"] * PROFILE_LAYERS,
                    "affine (lease 8 line)": a8 + b8 * layers}
        rest = t["cold_rest_s"] if i == 0 else t["warm_rest_s"]
        rows.append({"layers": layers, "start": start, "caches": "cold" if i == 0 else "warm",
                     **{f"capture_s {k}": round(v * PROBE_SIZES, 2) for k, v in per_size.items()},
                     **{f"ready_s {k}": round(rest + v * PROBE_SIZES, 1) for k, v in per_size.items()}})
    t61 = startup_terms(gpu, R1.num_hidden_layers)
    r1 = {"per size x layer": t61["per_bs_layer_s"] * R1.num_hidden_layers * R1_SIZES,
          "per size flat": t61["per_bs_layer_s"] * PROFILE_LAYERS * R1_SIZES,
          "affine (lease 8 line)": (a8 + b8 * R1.num_hidden_layers) * R1_SIZES}
    return {"gpu": gpu, "sizes": PROBE_SIZES, "lease8_line": {"a_s": a8, "b_s": b8}, "starts": rows,
            "r1_61_layers_52_sizes_warm_capture_s": {k: round(v, 1) for k, v in r1.items()}}


def print_prediction(res: dict) -> None:
    forms = ("per size x layer", "per size flat", "affine (lease 8 line)")
    print(f"{res['gpu']}: warm capture at {res['sizes']} sizes, then ready, each form "
          f"(lease 8 line: {res['lease8_line']['a_s']:+.3f} + {res['lease8_line']['b_s']:.4f} L s per size)")
    print(f"{'layers':>6} {'start':>5} {'caches':<6} " + " ".join(f"{f[:22]:>22}" for f in forms))
    for r in res["starts"]:
        cells = " ".join(f"{r['capture_s ' + f]:>9.2f} / {r['ready_s ' + f]:>9.1f}" for f in forms)
        print(f"{r['layers']:>6} {r['start']:>5} {r['caches']:<6} {cells}")
    print("R1 61 layers, 52 sizes, warm capture s: " + ", ".join(f"{k} {v}" for k, v in res["r1_61_layers_52_sizes_warm_capture_s"].items()))


def log_first_sizes(archive: Path) -> dict[str, float]:
    """First captured size's seconds per server log (member name) in the probe's archive."""
    out = {}
    with tarfile.open(archive) as tar:
        for name in tar.getnames():
            if not name.endswith(".log") or "/server-" not in f"/{name}":
                continue
            stream = tar.extractfile(name)
            text = stream.read().decode("utf-8", errors="replace").replace("\r", "\n") if stream else ""
            m = _FIRST.search(text)
            if m and _END.search(text):
                rate = float(m.group(2))
                out[Path(name).name] = rate if m.group(3) == "s/it" else 1 / rate
    return out


def capture_rows(raw_paths: list[Path]) -> list[tuple[str, dict]]:
    """Each start's decode-graph capture in the probe's raw files, with the name of its server log in the call's
    archive (lease 20 and lease 22 read the same files; each adds what it takes from the log)."""
    rows = []
    for path in raw_paths:
        raw = json.loads(read_text(path))
        layers = int(raw["model"]["config"]["num_hidden_layers"])
        for run in raw.get("runs", []):
            graphs = [g for g in (run.get("startup") or {}).get("cuda_graphs", []) if g.get("capture_s") is not None]
            if run.get("skipped") or not graphs:
                continue
            rows.append((f"server-{raw['name']}-{run['variant']}.log",
                         {"name": raw["name"], "variant": run["variant"], "layers": layers, "ready_s": run.get("ready_after_s"),
                          "capture_s": graphs[-1]["capture_s"], "sizes": len(graphs[-1]["bs"]), "gpu": raw["gpu"]["name"]}))
    return rows


def starts_from_raw(raw_paths: list[Path], logs: list[Path]) -> list[dict]:
    firsts = {name: s for archive in logs for name, s in log_first_sizes(archive).items()}
    return [{**row, "first_s": firsts.get(log)} for log, row in capture_rows(raw_paths)]


def read(raw_paths: list[Path], logs: list[Path], predicted: Path | None) -> int:
    rows = starts_from_raw(raw_paths, logs)
    print(f"{'server':<16} {'start':<6} {'layers':>6} {'sizes':>5} {'ready s':>7} {'capture s':>9} {'first s':>7} {'per size s':>10} caches")
    warm = []
    for r in rows:
        cold = r["first_s"] is None or r["first_s"] >= COLD_FIRST_SIZE_S
        first = f"{r['first_s']:7.2f}" if r["first_s"] is not None else f"{'?':>7}"
        print(f"{r['name']:<16} {r['variant']:<6} {r['layers']:>6} {r['sizes']:>5} {r['ready_s'] or 0:>7.1f} {r['capture_s']:>9.2f} "
              f"{first} {r['capture_s'] / r['sizes']:>10.4f} {'cold' if cold else 'warm'}")
        if not cold:
            warm.append((r["layers"], r["capture_s"] / r["sizes"]))
    if rows:
        print(f"GPU: {rows[0]['gpu']}")
    if predicted is not None and rows:
        print_errors(rows, predicted)
    counts = sorted({n for n, _ in warm})
    spreads = []
    for n in counts:
        same = [c for m, c in warm if m == n]
        spread = (max(same) - min(same)) / statistics.mean(same) if len(same) > 1 else float("nan")
        spreads += [spread] if len(same) > 1 else []
        print(f"  {n} layers: warm per size {', '.join(f'{c:.4f}' for c in same)} s (median {statistics.median(same):.4f}, "
              f"repeat spread {spread:.0%})")
    if len(counts) < 2:
        print("fewer than two layer counts with a warm start: no outcome (the model keeps today's form)")
        return 1
    a, b = line(warm)
    f = share_fixed(a, b)
    low, high = (statistics.median([c for m, c in warm if m == n]) for n in (counts[0], counts[-1]))
    print(f"line over {len(warm)} warm starts at {counts} layers: {a:+.4f} + {b:.5f} L s per size; "
          f"median {counts[-1]} / {counts[0]} layers = {high / low:.2f} (proportional {counts[-1] / counts[0]:.2f}, flat 1.00)")
    if spreads and max(spreads) > abs(high / low - 1):
        print(f"largest repeat spread {max(spreads):.0%} > the change between the extreme counts {abs(high / low - 1):.0%}: "
              f"not resolved (f = {f:.2f}); the model keeps today's form")
        return 0
    print(f"f = a / (a + {PROFILE_LAYERS} b) = {f:.2f} -> {outcome(f)}")
    return 0


def print_errors(rows: list[dict], predicted: Path) -> None:
    """Each start's capture against the pre-registered forms (the warm prediction of its count, or the cold one)."""
    gpu = "H200" if "H200" in rows[0]["gpu"] else "H100-SXM"
    table = next(r for r in json.loads(predicted.read_text()) if r["gpu"] == gpu)
    forms = [k.removeprefix("capture_s ") for k in table["starts"][0] if k.startswith("capture_s ")]
    errors: dict[str, list[float]] = {f: [] for f in forms}
    print(f"capture s against the registered forms ({gpu}; measured / predicted - 1):")
    for r in rows:
        cold = r["first_s"] is None or r["first_s"] >= COLD_FIRST_SIZE_S
        if cold:
            continue
        pred = next(p for p in table["starts"] if p["layers"] == r["layers"] and p["caches"] == "warm")
        cells = []
        for f in forms:
            err = pred[f"capture_s {f}"] / r["capture_s"] - 1
            errors[f].append(abs(err))
            cells.append(f"{f} {pred[f'capture_s {f}']:6.2f} ({err:+.0%})")
        print(f"  {r['name']:<16} {r['variant']:<6} {r['capture_s']:6.2f}: " + ", ".join(cells))
    print("  MAPE over the warm starts (predicted / measured - 1): " + ", ".join(
        f"{f} {statistics.mean(e):.0%}" for f, e in errors.items() if e))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--json", type=Path, help="also write the predictions here")
    r = sub.add_parser("read")
    r.add_argument("raw", type=Path, nargs="+", help="calibration-r1s<L>-lease20.json (or .xz)")
    r.add_argument("--logs", type=Path, nargs="*", default=[],
                   help="the probe's layer-probe.tar.xz of each call (server logs: the first size's seconds)")
    r.add_argument("--predicted", type=Path, help="the pre-registered predicted.json: each warm start against each form")
    args = ap.parse_args(argv)
    if args.cmd == "read":
        return read(args.raw, args.logs, args.predicted)
    results = [predict("H200", [4, 10, 7]), predict("H100-SXM", [4, 6, 5])]
    for res in results:
        print_prediction(res)
        print()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
