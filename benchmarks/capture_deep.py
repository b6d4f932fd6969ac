"""Lease 22's warm-capture law out of sample at the deepest R1-shaped layer count one H200 holds (issue 25, hcapdeep;
scripts/device/layer_probe.sh 14 4 with lease 22's plan: three fresh servers a count, the first of the call cold).

    predict [--json F]   the registration: which counts fit one H200 (the planner's memory table and lease 22's logged
              weights), the law's warm capture at 14 and 4 layers (36 sizes) and their ratio with the 90 % bootstrap
              band of lease 22's warm starts, the other forms' ratios, and the planner's whole start-up (launch ->
              ready, warm and cold) of the back-test rows the lease will add
    read RAW.json ... --logs TAR ... --predicted F   each start's class (capture_layer_repeats: cold / after-cold /
              warm), the measured 14 / 4 ratio against the band, the registered outcome, and the start-up rows'
              measurements against the planner (benchmarks/results/2026-11-28-capture-deep-predicted/README.md)

    python3 benchmarks/manifest.py record --out benchmarks/results/2026-11-28-capture-deep-predicted --stdout output.txt -- \\
        .venv/bin/python benchmarks/capture_deep.py predict --json benchmarks/results/2026-11-28-capture-deep-predicted/predicted.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.capture_layer_count import PROBE_SIZES, line  # noqa: E402
from benchmarks.capture_layer_repeats import BOOTSTRAP, INTERVAL, SEED, starts  # noqa: E402
from orchestrator.compressed import read_text  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.perfmodel.profile import CaptureLayerLaw  # noqa: E402
from orchestrator.plan.deadline import engine_start_s  # noqa: E402
from orchestrator.plan.memory.server_fit import group_memory  # noqa: E402

DEEP, REFERENCE = 14, 4  # the deepest count that fits one H200 (below), and lease 22's shallowest, measured beside it
LAW = ROOT / "orchestrator/perfmodel/profiles/capture/h200-r1-shaped-fp8-lease22.json"
ROW_CONFIG = "benchmarks/backtest/configs/h200-r1shaped-6l.yaml"
ROW_MODEL = f"benchmarks/backtest/models/r1-shaped-{DEEP}l"
# the probe's servers as the back-test rows set them: SGLang's defaults on one H200 (mem 0.907, graphs to 256)
ROW_SET = ["model.context_length=16384", "engine.sglang.mem_fraction_static=null",
           "engine.sglang.extra_args=[--sampling-backend, pytorch]"]
# lease 22's server logs on one H200 (benchmarks/results/2026-11-27-lease22-h200/call4-probe/layer-probe.tar.xz):
# 'Load weight begin. avail mem=139.11 GB', weights 'mem usage=' 16.04 / 59.20 / 102.10 GB at 4 / 8 / 12 layers,
# 'KV Cache is allocated ... #tokens: 1869036, KV size: 24.06 GB' at 12 (SGLang's GB = GiB)
AVAIL_AT_LOAD_GIB, WEIGHTS_GIB, KV_GIB_12, KV_TOKENS_12 = 139.11, {4: 16.04, 8: 59.20, 12: 102.10}, 24.06, 1869036
H200_TOTAL_GIB, MEM_FRACTION = 143771 / 1024, 0.907  # nvidia-smi's 143,771 MiB; SGLang 0.5.17's default on it
PROBE_TOKENS = 256 * (256 + 100)  # the largest decode point: 256 prompts of 256 tokens, 100 steps each
COUNTS = (12, 13, 14, 15, 16, 20)
CALLS = {"3": [DEEP, REFERENCE], "4": [DEEP, REFERENCE]}
BOUND = 0.25  # the back-test start-up rows' bound (as every other start-up row)


def row_config(layers: int, tmp: Path):
    model = ROOT / ROW_MODEL if layers == DEEP else tmp / f"r1-shaped-{layers}l"
    if not model.exists():
        cfg = json.loads((ROOT / ROW_MODEL / "config.json").read_text())
        model.mkdir(parents=True)
        (model / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": layers}))
    return load_config(ROOT / ROW_CONFIG, [*ROW_SET, f"model.path={model}"], paths_from=ROOT)


def memory_rows(tmp: Path) -> list[dict]:
    """Each count against the planner's fit rule (weights under the static pool, KV for a prefill chunk) and against
    lease 22's logged weights and SGLang's own rule (KV = free after the weights - the (1 - mem fraction) reserve)."""
    per_moe = (WEIGHTS_GIB[12] - WEIGHTS_GIB[8]) / 4
    per_token_layer = KV_GIB_12 / KV_TOKENS_12 / 12
    out = []
    for n in COUNTS:
        cfg = row_config(n, tmp)
        role, index, group = cfg.layout.groups()[0]
        mem = group_memory(cfg, role, index, group)
        weights = WEIGHTS_GIB[12] + (n - 12) * per_moe
        kv = AVAIL_AT_LOAD_GIB - weights - H200_TOTAL_GIB * (1 - MEM_FRACTION)
        tokens = max(0, int(kv / (per_token_layer * n)))
        out.append({"layers": n, "planner_weights_gb": round(mem.weights_gb, 1), "planner_pool_gb": round(mem.static_pool_gb, 1),
                    "planner_kv_tokens": mem.kv_capacity_tokens, "planner_fits_weights_and_kv": mem.weights_gb < mem.static_pool_gb
                    and mem.kv_capacity_tokens >= 8192, "planner_verdict": mem.verdict, "logged_weights_gib": round(weights, 2), "sglang_kv_gib": round(kv, 2),
                    "sglang_kv_tokens": tokens, "fits_probe": tokens >= PROBE_TOKENS})
    return out


def law_band(law: CaptureLayerLaw) -> dict:
    """The law's capture per size at DEEP and REFERENCE layers and their ratio, with the 90 % interval of lease 22's
    read (each count's warm starts resampled with replacement, seed 22, 2000 times)."""
    warm: dict[int, list[float]] = {}
    for s in law.warm_starts:
        warm.setdefault(s.layers, []).append(s.capture_s / s.sizes)
    a, b = law.line()
    rng = np.random.default_rng(SEED)
    deep, ratio = [], []
    for _ in range(BOOTSTRAP):
        ra, rb = line([(float(n), float(c)) for n, cs in warm.items() for c in rng.choice(cs, size=len(cs), replace=True)])
        deep.append(ra + rb * DEEP)
        ratio.append((ra + rb * DEEP) / (ra + rb * REFERENCE))
    d_lo, d_hi = np.quantile(deep, INTERVAL)
    r_lo, r_hi = np.quantile(ratio, INTERVAL)
    return {"line_a_s": round(a, 5), "line_b_s": round(b, 6), "f": round(law.fixed_share(6), 3),
            "deep_capture_s": round((a + b * DEEP) * PROBE_SIZES, 2), "deep_capture_band_s": [round(d_lo * PROBE_SIZES, 2), round(d_hi * PROBE_SIZES, 2)],
            "reference_capture_s": round((a + b * REFERENCE) * PROBE_SIZES, 2),
            "ratio": round((a + b * DEEP) / (a + b * REFERENCE), 3), "ratio_band": [round(float(r_lo), 3), round(float(r_hi), 3)],
            "ratio_proportional": round(DEEP / REFERENCE, 3), "ratio_flat": 1.0}


def planner(tmp: Path) -> dict:
    out = {}
    for n in (DEEP, REFERENCE):
        cfg = row_config(n, tmp)
        role, _, group = cfg.layout.groups()[0]
        model = cost_model_for(cfg, role, group)
        for caches, cached in (("warm", True), ("cold", False)):
            ready, _, detail = engine_start_s(cfg, jit_cached=cached)
            graphs = model.startup_breakdown_s("dummy", jit_cached=cached)["cuda_graphs"]
            out[f"{n} {caches}"] = {"ready_s": round(ready, 1), "cuda_graphs_s": round(graphs, 1), "detail": detail}
    return out


def predict() -> dict:
    law = CaptureLayerLaw.model_validate(json.loads(LAW.read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        return {"gpu": "H200", "sizes": PROBE_SIZES, "deep": DEEP, "reference": REFERENCE, "calls": CALLS,
                "law": law_band(law), "memory": memory_rows(Path(tmp)), "planner": planner(Path(tmp)), "bound": BOUND}


def print_prediction(res: dict) -> None:
    print(f"memory on one H200 (planner: weights / static pool GB, KV tokens; lease 22's logs: weights GiB, SGLang's KV; "
          f"the probe's largest point needs {PROBE_TOKENS:,} tokens)")
    for m in res["memory"]:
        print(f"  {m['layers']:>2} layers: planner {m['planner_weights_gb']:6.1f} / {m['planner_pool_gb']:.1f} GB, KV {m['planner_kv_tokens']:>9,} "
              f"tokens ({'fits' if m['planner_fits_weights_and_kv'] else 'does not fit'}; plan: {m['planner_verdict']}); logged {m['logged_weights_gib']:6.2f} GiB, "
              f"KV {m['sglang_kv_gib']:6.2f} GiB = {m['sglang_kv_tokens']:>9,} tokens ({'fits' if m['fits_probe'] else 'does not fit'} the probe)")
    law = res["law"]
    print(f"law (lease 22's warm starts, H200): {law['line_a_s']:+.5f} + {law['line_b_s']:.6f} L s per size, f = {law['f']}")
    print(f"  warm capture at {res['sizes']} sizes: {res['deep']} layers {law['deep_capture_s']} s (90 % band "
          f"{law['deep_capture_band_s'][0]}-{law['deep_capture_band_s'][1]}), {res['reference']} layers {law['reference_capture_s']} s")
    print(f"  ratio {res['deep']} / {res['reference']} layers: {law['ratio']} (90 % band {law['ratio_band'][0]}-{law['ratio_band'][1]}); "
          f"per size x layer {law['ratio_proportional']}, flat {law['ratio_flat']}")
    print(f"planner (the back-test rows' config, {ROW_CONFIG} + {ROW_MODEL}), launch -> ready:")
    for key, p in res["planner"].items():
        print(f"  {key:<8} {p['ready_s']:6.1f} s (cuda graphs {p['cuda_graphs_s']} s): {p['detail']}")


def verdict(ratio: float, band: list[float]) -> str:
    if band[0] <= ratio <= band[1]:
        return "HOLDS: inside the law's band"
    side = "per size x layer (steeper)" if ratio > band[1] else "flat"
    return f"MISSES: outside the law's band, toward {side}"


def failed_starts(raw_paths: list[Path], archives: list[Path]) -> list[tuple[str, str, str]]:
    """(server, start, why) of every start that never became ready: the raw file's error and, where the server's log
    in the call's archive has one, its CUDA out-of-memory line."""
    ooms = {}
    for archive in archives:
        with tarfile.open(archive) as tar:
            for m in tar.getmembers():
                stream = tar.extractfile(m) if m.isfile() and m.name.endswith(".log") else None
                text = stream.read().decode("utf-8", errors="replace") if stream else ""
                line = next((x for x in text.splitlines() if "CUDA out of memory" in x), None)
                if line:
                    ooms[Path(m.name).name] = line.split(" If reserved")[0].removeprefix("torch.OutOfMemoryError: ").strip()
    out = []
    for path in raw_paths:
        raw = json.loads(read_text(path))
        for run in raw.get("runs", []):
            if run.get("error"):
                log = f"server-{raw['name']}-{run['variant']}.log"
                out.append((raw["name"], run["variant"], ooms.get(log) or run["error"].splitlines()[0]))
    return out


def read(raw_paths: list[Path], archives: list[Path], predicted: Path) -> int:
    reg = json.loads(predicted.read_text())
    rows = starts(raw_paths, archives)
    print(f"{'server':<18} {'start':<6} {'layers':>6} {'sizes':>5} {'ready s':>7} {'capture s':>9} {'per size s':>10} class")
    for r in rows:
        print(f"{r['name']:<18} {r['variant']:<6} {r['layers']:>6} {r['sizes']:>5} {r['ready_s'] or 0:>7.1f} "
              f"{r['capture_s']:>9.2f} {r['capture_s'] / r['sizes']:>10.4f} {r['class']}")
    for name, variant, error in failed_starts(raw_paths, archives):
        print(f"{name:<18} {variant:<6} did not start: {error}")
    if not rows or "H200" not in rows[0]["gpu"]:
        print("no start on an H200: no outcome")
        return 1
    deep, ref, law = reg["deep"], reg["reference"], reg["law"]
    warm = {n: [r["capture_s"] / r["sizes"] for r in rows if r["class"] == "warm" and r["layers"] == n] for n in (deep, ref)}
    for n, cs in warm.items():
        print(f"  {n} layers: {len(cs)} warm, per size {', '.join(f'{c:.4f}' for c in cs) or '-'} s")
    if warm[deep] and warm[ref]:
        ratio = statistics.median(warm[deep]) / statistics.median(warm[ref])
        print(f"ratio {deep} / {ref} layers (medians, same host): {ratio:.3f}; registered {law['ratio']} "
              f"(band {law['ratio_band'][0]}-{law['ratio_band'][1]}), per size x layer {law['ratio_proportional']}, flat 1.0")
        print(f"outcome: {verdict(ratio, law['ratio_band'])}")
    else:
        print(f"outcome: NOT RESOLVED: no warm start at {deep} or at {ref} layers")
    if warm[deep]:
        deep_s = statistics.median(warm[deep]) * reg["sizes"]
        lo, hi = law["deep_capture_band_s"]
        where = "inside" if lo <= deep_s <= hi else "outside"
        print(f"absolute (host-confounded, reported only): {deep} layers median warm capture {deep_s:.2f} s, lease 22's level "
              f"{law['deep_capture_s']} s (band {lo}-{hi}): {where}; the planner prices {reg['planner'][f'{deep} warm']['cuda_graphs_s']} s")
    for r in rows:
        if r["layers"] == ref and r["class"] == "cold":
            pred = reg["planner"][f"{ref} cold"]["ready_s"]
            print(f"{ref} layers cold (registered as reported only): ready {r['ready_s']:.1f} s, capture {r['capture_s']:.2f} s; "
                  f"planner {pred} s ({pred / r['ready_s'] - 1:+.1%})")
    for caches, picked in (("cold", [r for r in rows if r["layers"] == deep and r["class"] == "cold"]),
                           ("warm", [r for r in rows if r["layers"] == deep and r["class"] != "cold"])):
        if not picked:
            print(f"start-up row {deep} layers {caches}: no start")
            continue
        ready = [round(r["ready_s"], 1) for r in picked]
        pred = reg["planner"][f"{deep} {caches}"]["ready_s"]
        err = pred / statistics.mean(ready) - 1
        print(f"start-up row {deep} layers {caches}: ready_s {ready}, graph_capture_s {[round(r['capture_s'], 2) for r in picked]}; "
              f"planner {pred} s ({err:+.1%}, bound ±{reg['bound']:.0%}: {'inside' if abs(err) <= reg['bound'] else 'outside'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--json", type=Path, help="also write the predictions here")
    r = sub.add_parser("read")
    r.add_argument("raw", type=Path, nargs="+", help="calibration-r1s<L>-capdeep*.json (or .xz) of every probe call")
    r.add_argument("--logs", type=Path, nargs="+", required=True, help="each probe call's layer-probe.tar.xz (server logs)")
    r.add_argument("--predicted", type=Path, required=True, help="the registered predicted.json")
    args = ap.parse_args(argv)
    if args.cmd == "read":
        return read(args.raw, args.logs, args.predicted)
    res = predict()
    print_prediction(res)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
