"""Warm decode CUDA-graph capture against the layer count, three kept warm starts a count (issue 25, lease 22;
scripts/device/layer_probe.sh with benchmarks/calibration/plans/lease22-capture-repeats.json: three starts a count).

Lease 20 (benchmarks/capture_layer_count.py) was not resolved: its first warm start after the cold start captured in
13.44 s where the same count's later starts took 4.49 / 5.37 s. Lease 22 registers that start as its own class.

    predict   each count's warm capture at the probe's 36 graph sizes as three forms price it: per size x layer (the
              model today: the R1-shaped profile's figure x sizes x layers), per size flat (the profile's own 6-layer
              capture per size at any count) and affine per size through lease 20's warm starts without the one right
              after the cold start; and R1's 61 layers at 52 sizes each way
    read RAW.json ... --logs TAR ...   each start's class (cold: first size >= 30 s; after-cold: the next start of
              the same call; warm: the rest), >= 3 warm starts at each extreme count, the least-squares line of the warm starts' capture per size over the
              layer count, f = a / (a + 6 b), its 90 % bootstrap interval (resampling each count's warm starts) and
              the outcome of the registered rule (benchmarks/results/2026-11-27-lease22-predicted/README.md);
              --law-json FILE: where the outcome is affine, the kept warm starts as the planner's capture law
              (orchestrator/perfmodel/profiles/capture/, perfmodel/profile.CaptureLayerLaw)

    python3 benchmarks/manifest.py record --out benchmarks/results/2026-11-27-lease22-predicted --stdout output.txt -- \\
        .venv/bin/python benchmarks/capture_layer_repeats.py predict --json benchmarks/results/2026-11-27-lease22-predicted/predicted.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.capture_layer_count import (  # noqa: E402
    _END,
    _FIRST,
    COLD_FIRST_SIZE_S,
    PROBE_SIZES,
    PROFILE_LAYERS,
    R1,
    R1_SIZES,
    capture_rows,
    line,
    outcome,
    share_fixed,
    startup_terms,
)
from orchestrator.compressed import read_text  # noqa: E402

# lease 20's warm starts on one H200 without the one right after the cold start (capture s at 36 sizes;
# benchmarks/results/2026-11-27-lease20-read/output.txt): 4 layers 4.49 / 5.37, 7 layers 5.33 / 5.12, 10 layers
# 6.61 / 6.81 / 6.10
LEASE20_WARM = ((4, 4.49), (4, 5.37), (7, 5.33), (7, 5.12), (10, 6.61), (10, 6.81), (10, 6.10))
COUNTS = {"H200": ([4, 12, 8], [12, 4, 8]), "H100-SXM": ([4, 6, 5], [6, 4, 5])}  # call 3's order, call 4's
MIN_WARM = 3  # warm starts each extreme count needs (the middle count's, any number, enter the line)
BOOTSTRAP, INTERVAL, SEED = 2000, (0.05, 0.95), 22
READ = "benchmarks/results/2026-11-27-lease22-read/"  # the registered read that adopted the form (its output.txt)


def forms_per_size(gpu: str, layers: int) -> dict[str, float]:
    a20, b20 = line([(n, s / PROBE_SIZES) for n, s in LEASE20_WARM])
    per_bs_layer = startup_terms(gpu, layers)["per_bs_layer_s"]
    return {"per size x layer": per_bs_layer * layers, "per size flat": per_bs_layer * PROFILE_LAYERS,
            "affine (lease 20 line)": a20 + b20 * layers}


def predict(gpu: str) -> dict:
    a20, b20 = line([(n, s / PROBE_SIZES) for n, s in LEASE20_WARM])
    first, second = COUNTS[gpu]
    t = startup_terms(gpu, first[0])
    cold = {k: round(t["cold_rest_s"] + v * PROBE_SIZES, 1) for k, v in forms_per_size(gpu, first[0]).items()}
    counts = []
    for n in sorted(set(first)):
        warm_rest = startup_terms(gpu, n)["warm_rest_s"]
        per_size = forms_per_size(gpu, n)
        counts.append({"layers": n, **{f"capture_s {k}": round(v * PROBE_SIZES, 2) for k, v in per_size.items()},
                       **{f"ready_s {k}": round(warm_rest + v * PROBE_SIZES, 1) for k, v in per_size.items()}})
    t61 = startup_terms(gpu, R1.num_hidden_layers)["per_bs_layer_s"]
    f20 = share_fixed(a20, b20)
    r1 = {"per size x layer": t61 * R1.num_hidden_layers * R1_SIZES, "per size flat": t61 * PROFILE_LAYERS * R1_SIZES,
          f"affine, f = {f20:.2f} on the profile": t61 * PROFILE_LAYERS * R1_SIZES
          * (f20 + (1 - f20) * R1.num_hidden_layers / PROFILE_LAYERS)}
    return {"gpu": gpu, "sizes": PROBE_SIZES, "calls": {"3": first, "4": second},
            "lease20_line": {"a_s": a20, "b_s": b20, "f": f20}, "cold_ready_s": cold, "warm": counts,
            "r1_61_layers_52_sizes_warm_capture_s": {k: round(v, 1) for k, v in r1.items()}}


def print_prediction(res: dict) -> None:
    line20 = res["lease20_line"]
    print(f"{res['gpu']}: calls' layer counts {res['calls']['3']} then {res['calls']['4']}; warm capture at {res['sizes']} "
          f"sizes / ready, each form (lease 20 line: {line20['a_s']:+.4f} + {line20['b_s']:.5f} L s per size, f = {line20['f']:.2f})")
    forms = [k.removeprefix("capture_s ") for k in res["warm"][0] if k.startswith("capture_s ")]
    print(f"{'layers':>6} " + " ".join(f"{f[:22]:>22}" for f in forms))
    for r in res["warm"]:
        print(f"{r['layers']:>6} " + " ".join(f"{r['capture_s ' + f]:>9.2f} / {r['ready_s ' + f]:>9.1f}" for f in forms))
    print(f"cold first start ({res['calls']['3'][0]} layers) ready s: " + ", ".join(f"{k} {v}" for k, v in res["cold_ready_s"].items()))
    print("R1 61 layers, 52 sizes, warm capture s: " + ", ".join(f"{k} {v}" for k, v in res["r1_61_layers_52_sizes_warm_capture_s"].items()))


def call_starts(archive: Path) -> list[tuple[str, float | None]]:
    """(server log name, first captured size's seconds) of each start in the call's archive, in the order they ran
    (each log's modification time: a server's log is last written when it stops)."""
    with tarfile.open(archive) as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and Path(m.name).name.startswith("server-")
                          and m.name.endswith(".log")), key=lambda m: m.mtime)
        out = []
        for m in members:
            stream = tar.extractfile(m)
            text = stream.read().decode("utf-8", errors="replace").replace("\r", "\n") if stream else ""
            first = _FIRST.search(text)
            seconds = None
            if first and _END.search(text):
                rate = float(first.group(2))
                seconds = rate if first.group(3) == "s/it" else 1 / rate
            out.append((Path(m.name).name, seconds))
    return out


def classes(archives: list[Path]) -> dict[str, str]:
    """cold (first size >= 30 s, or no capture read), after-cold (the start right after a cold one in its call), warm."""
    out = {}
    for archive in archives:
        previous_cold = False
        for name, first in call_starts(archive):
            cold = first is None or first >= COLD_FIRST_SIZE_S
            out[name] = "cold" if cold else ("after-cold" if previous_cold else "warm")
            previous_cold = cold
    return out


def starts(raw_paths: list[Path], archives: list[Path]) -> list[dict]:
    cls = classes(archives)
    return [{**row, "class": cls.get(log, "no log")} for log, row in capture_rows(raw_paths)]


def f_interval(warm: dict[int, list[float]]) -> tuple[float, float]:
    rng = np.random.default_rng(SEED)
    fs = []
    for _ in range(BOOTSTRAP):
        points = [(float(n), float(c)) for n, cs in warm.items() for c in rng.choice(cs, size=len(cs), replace=True)]
        a, b = line(points)
        fs.append(share_fixed(a, b))
    low, high = np.quantile(fs, INTERVAL)
    return float(low), float(high)


def band(f: float) -> str:
    return "superlinear" if f < 0 else "proportional" if f <= 0.2 else "flat" if f >= 0.8 else "affine"


def capture_law(raw_paths: list[Path], archives: list[Path], command: str) -> dict:
    """The planner's capture law (perfmodel/profile.CaptureLayerLaw) from the probe's raw files: the layer shape of
    its smallest count and every warm start, as the read keeps them."""
    rows = [r for r in starts(raw_paths, archives) if r["class"] == "warm"]
    raw = min((json.loads(read_text(p)) for p in raw_paths), key=lambda r: r["model"]["config"]["num_hidden_layers"])
    c = raw["model"]["config"]
    quantization = (c.get("quantization_config") or {}).get("quant_method", "bf16")
    shape = ("hidden_size", "num_hidden_layers", "first_k_dense_replace", "n_routed_experts", "num_experts_per_tok",
             "moe_intermediate_size", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim")
    folder = raw_paths[0].resolve().relative_to(ROOT).parts[:3]
    return {"model": {"name": f"r1-shaped-{c['num_hidden_layers']}l", **{k: c[k] for k in shape}, "quantization": quantization},
            "gpu": "H200" if "H200" in rows[0]["gpu"] else "H100-SXM", "raw": "/".join(folder) + "/",
            "read": READ, "command": command,
            "warm_starts": [{"layers": r["layers"], "sizes": r["sizes"], "capture_s": r["capture_s"]} for r in rows]}


def read(raw_paths: list[Path], archives: list[Path], predicted: Path | None, law_json: Path | None = None) -> int:
    rows = starts(raw_paths, archives)
    print(f"{'server':<16} {'start':<6} {'layers':>6} {'sizes':>5} {'ready s':>7} {'capture s':>9} {'per size s':>10} class")
    for r in rows:
        print(f"{r['name']:<16} {r['variant']:<6} {r['layers']:>6} {r['sizes']:>5} {r['ready_s'] or 0:>7.1f} "
              f"{r['capture_s']:>9.2f} {r['capture_s'] / r['sizes']:>10.4f} {r['class']}")
    if not rows:
        print("no start with a capture: no outcome")
        return 1
    gpu = "H200" if "H200" in rows[0]["gpu"] else "H100-SXM"
    print(f"GPU: {rows[0]['gpu']} (read under the {gpu} predictions)")
    warm: dict[int, list[float]] = {}
    for r in rows:
        if r["class"] == "warm":
            warm.setdefault(r["layers"], []).append(r["capture_s"] / r["sizes"])
    for r in rows:
        if r["class"] == "after-cold":
            same = warm.get(r["layers"], [])
            verdict = "slower than every kept warm start of its count" if same and r["capture_s"] / r["sizes"] > max(same) else "not slower than every kept warm start"
            print(f"after-cold start {r['name']} {r['variant']}: {r['capture_s']:.2f} s, {verdict} (registered: slower)")
    if predicted is not None:
        print_errors(rows, predicted, gpu)
    for n, cs in sorted(warm.items()):
        spread = (max(cs) - min(cs)) / statistics.mean(cs)
        print(f"  {n} layers: {len(cs)} warm, per size {', '.join(f'{c:.4f}' for c in cs)} s (median {statistics.median(cs):.4f}, "
              f"repeat spread {spread:.0%})")
    short = [n for n in (min(COUNTS[gpu][0]), max(COUNTS[gpu][0])) if len(warm.get(n, [])) < MIN_WARM]
    if short:
        print(f"fewer than {MIN_WARM} warm starts at {short} layers: not resolved; the model keeps today's form")
        return 0
    a, b = line([(float(n), c) for n, cs in warm.items() for c in cs])
    f = share_fixed(a, b)
    low, high = f_interval(warm)
    lo_n, hi_n = min(warm), max(warm)
    change = statistics.median(warm[hi_n]) / statistics.median(warm[lo_n]) - 1
    print(f"line over {sum(map(len, warm.values()))} warm starts: {a:+.4f} + {b:.5f} L s per size; median {hi_n} / {lo_n} "
          f"layers = {1 + change:.2f} (proportional {hi_n / lo_n:.2f}, flat 1.00)")
    print(f"f = a / (a + {PROFILE_LAYERS} b) = {f:.2f}, 90 % bootstrap interval {low:.2f} .. {high:.2f} "
          f"({BOOTSTRAP} resamples of each count's warm starts, seed {SEED})")
    if band(low) != band(high):
        print(f"interval spans {band(low)} .. {band(high)}: not resolved; the model keeps today's form")
        return 0
    print(f"resolved ({band(f)}): {outcome(f)}")
    if law_json is not None and band(f) == "affine":
        command = " ".join([".venv/bin/python", "benchmarks/capture_layer_repeats.py", *sys.argv[1:]])
        law_json.write_text(json.dumps(capture_law(raw_paths, archives, command), indent=1) + "\n")
        print(f"capture law: {law_json.resolve().relative_to(ROOT)}")
    return 0


def print_errors(rows: list[dict], predicted: Path, gpu: str) -> None:
    table = next(r for r in json.loads(predicted.read_text()) if r["gpu"] == gpu)
    forms = [k.removeprefix("capture_s ") for k in table["warm"][0] if k.startswith("capture_s ")]
    errors: dict[str, list[float]] = {f: [] for f in forms}
    print(f"warm capture s against the registered forms ({gpu}; predicted / measured - 1):")
    for r in rows:
        pred = next((p for p in table["warm"] if p["layers"] == r["layers"]), None)
        if r["class"] != "warm" or pred is None:
            continue
        cells = []
        for f in forms:
            err = pred[f"capture_s {f}"] / r["capture_s"] - 1
            errors[f].append(abs(err))
            cells.append(f"{f} {pred[f'capture_s {f}']:6.2f} ({err:+.0%})")
        print(f"  {r['name']:<16} {r['variant']:<6} {r['capture_s']:6.2f}: " + ", ".join(cells))
    print("  MAPE over the warm starts: " + ", ".join(f"{f} {statistics.mean(e):.0%}" for f, e in errors.items() if e))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--json", type=Path, help="also write the predictions here")
    r = sub.add_parser("read")
    r.add_argument("raw", type=Path, nargs="+", help="calibration-r1s<L>-lease22*.json (or .xz) of every call")
    r.add_argument("--logs", type=Path, nargs="+", required=True,
                   help="each call's layer-probe.tar.xz (server logs: each start's first size and its order in the call)")
    r.add_argument("--predicted", type=Path, help="the pre-registered predicted.json: each warm start against each form")
    r.add_argument("--law-json", type=Path, help="where the outcome is affine: write the kept warm starts here as the "
                   "planner's capture law (orchestrator/perfmodel/profiles/capture/)")
    args = ap.parse_args(argv)
    if args.cmd == "read":
        return read(args.raw, args.logs, args.predicted, args.law_json)
    results = [predict(gpu) for gpu in COUNTS]
    for res in results:
        print_prediction(res)
        print()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
