"""Decode CUDA-graph capture at start-up, by layer shape and GPU, from the SGLang logs on record; the cold PD prefills'
first forwards after ready, by shape; the weight load and KV allocation of every committed dummy-weight start; the
R1-shaped cold starts on H200 beside the planner's start-up for them; then the back-test's start-up rows as the
planner predicts them now (issue 25, hstart, hstart2).

    .venv/bin/python benchmarks/startup_capture_by_shape.py

Per start-up log: the shape, the GPU, how many batch sizes were captured, the whole capture (SGLang's "Capture cuda
graph end. elapsed=") and its first size (the progress bar's rate after 1 of N): >= 30 s is a compile (cold Triton
cache), else warm. Then, per shape and GPU, the median cold first size and the median warm capture per size: the
figures the planner's start-up lending uses (perfmodel/calibration_lookup.py) are set beside them. Per cold PD prefill
log (PDO_ITER lines): SGLang's own warm-up forward before ready, and after ready the first three forwards carrying a
prompt (more than one token) and any other of >= 0.5 s, as sequences x tokens = run_batch ms. Per SGLang start whose
log has its `Engine startup timings` line (every log file and archive member under benchmarks/results, one start
counted once): load_weight s against the weights' GiB per GPU (`Load weight end ... mem usage`), and
kv_cache_allocation s against the KV pool's GiB.
"""

from __future__ import annotations

import lzma
import re
import statistics
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.calibrate.logparse import startup  # noqa: E402
from orchestrator.compressed import read_text  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.perfmodel.gpus import GB, GIB, gpu_spec  # noqa: E402
from orchestrator.plan.backtest.predict import run_backtest  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# (shape, GPU, archive under benchmarks/results, the member's name ends with): every decode or aggregated server log of
# a start-up that captured graphs, of the three shapes the planner has start-up figures for
LOGS = [
    ("V2-Lite", "H100", "2026-11-27-warmup-fix-h100/pd-warmupfix.tar.xz", "decode-0-0.log"),  # lease 9
    ("V2-Lite", "H100", "2026-11-27-lease13-h100/call5-pd/pd-warmupfix.tar.xz", "decode-0-0.log"),
    ("V2-Lite", "H100", "2026-11-27-lease13-h100/call6-product/burst-shipped.tar.xz", "aggregated-0-0.log"),
    ("V2-Lite", "H100", "2026-11-27-lease15-h100/call3-product/burst-shipped.tar.xz", "aggregated-0-0.log"),
    ("V2-Lite", "H100", "2026-11-27-lease7-h100/call4-agg-h100x2/agg-inrun.tar.xz", "aggregated-0-0.log"),
    ("V2-Lite", "H100", "2026-11-27-lease7-h100/call8-agg-h100x1/agg-inrun.tar.xz", "aggregated-0-0.log"),
    ("V2-Lite", "H100", "2026-11-27-lease10-h100/call4-lone/lone10.tar.xz", "lone.log"),
    ("V2-Lite", "H100", "2026-11-26-two-gpu-lease3-h100x2/call4-pd/pd.tar.xz", "decode-0-0.log"),
    ("V2-Lite", "H100", "2026-11-26-two-gpu-lease3-h100x2/call5-agg/agg-tp2.tar.xz", "aggregated-0-0.log"),
    ("V2-Lite", "H100", "2026-11-26-two-gpu-lease4-h100x2/call3-agg-ab/agg-tp2-graphs1024.tar.xz", "190632-0fc035/aggregated-0-0.log"),
    ("V2-Lite", "H100", "2026-11-26-two-gpu-lease4-h100x2/call3-agg-ab/agg-tp2-graphs256.tar.xz", "191122-946694/aggregated-0-0.log"),
    ("V2-Lite", "H100", "2026-11-26-two-gpu-lease4-h100x2/call5-pd-ab/pd-mem065.tar.xz", "decode-0-0.log"),
    ("V2-Lite", "H100", "2026-11-26-two-gpu-lease4-h100x2/call5-pd-ab/pd-mem055.tar.xz", "decode-0-0.log"),
    ("V2-Lite", "H100", "2026-11-26-sglang-one-h100/bench-agg-call11.tar.xz", "aggregated-0-0.log"),
    ("V2-Lite", "H100", "2026-11-24-calibration-h100-v2lite/logs-v2lite.tar.xz", "server-v2lite-cold-default.log"),
    ("V2-Lite", "H100", "2026-11-24-calibration-h100-v2lite/logs-v2lite.tar.xz", "server-v2lite-warm-default.log"),
    ("V2-Lite", "H200", "device-h200x2-2026-11-21/raw.tar.xz", "c2/call1/agg0.log"),
    ("V2-Lite", "H200", "device-h200x2-2026-11-21/raw.tar.xz", "c5/c/engines/aggregated-0-0.log"),
    ("V2-Lite", "H200", "device-h200x2-2026-11-21/raw.tar.xz", "c5/c/engines/aggregated-1-0.log"),
    ("V2-Lite", "H200", "device-h200x2-2026-11-21/raw.tar.xz", "c4/c/engines/decode-0-0.log"),
    ("V2-Lite", "H200", "2026-11-26-two-gpu-lease2-h200x2/call3-pd-cold-prepare/pd-cut.tar.xz", "decode-0-0.log"),
    ("V2-Lite", "H200", "2026-11-26-two-gpu-lease5-h200x2/call3-eager-ab/pd-inrun.tar.xz", "decode-0-0.log"),
    ("R1-shaped 6 layers", "H100", "2026-11-24-calibration-h100-r1shaped/logs-r1.tar.xz", "server-r1s6-cold-default.log"),
    ("R1-shaped 6 layers", "H100", "2026-11-24-calibration-h100-r1shaped/logs-r1.tar.xz", "server-r1s6-warm-default.log"),
    ("R1-shaped 4 layers", "H100", "2026-11-27-lease8-r1-layers-h100/call2/layer-probe.tar.xz", "server-r1s4-lease8-layers.log"),
    ("Qwen3-shaped 6 layers", "H100", "2026-11-26-qwen3-serve-one-h100/prepare-call8.tar.xz", "decode-0-0.log"),
    ("Qwen3-shaped 6 layers", "H100", "2026-11-26-qwen3-serve-one-h100/prepare-call14.tar.xz", "decode-0-0.log"),
    ("Qwen3-shaped 6 layers", "H200", "2026-11-27-lease11-h200x2/call5-prepare/prepare.tar.xz", "decode-0-0.log"),
    # one shape at several layer counts on one host (layer-count probes): does capture grow with the layers?
    ("R1-shaped 3 layers probe", "H100", "2026-11-27-lease8-r1-layers-h100/call3/layer-probe.tar.xz", "server-r1s3-lease8-layers.log"),
    ("R1-shaped 5 layers probe", "H100", "2026-11-27-lease8-r1-layers-h100/call3/layer-probe.tar.xz", "server-r1s5-lease8-layers.log"),
    ("R1-shaped 6 layers probe", "H100", "2026-11-27-lease8-r1-layers-h100/call2/layer-probe.tar.xz", "server-r1s6-lease8-layers.log"),
    ("Qwen3-shaped 6 layers probe", "H100", "2026-11-27-lease12-h100/call3-probe/layer-probe.tar.xz", "server-q3l6-lease11-qwen3-layers.log"),
    ("Qwen3-shaped 12 layers probe", "H100", "2026-11-27-lease12-h100/call4-probe12/layer-probe.tar.xz", "server-q3l12-lease11-qwen3-layers.log"),
    ("Qwen3 TP4xEP4 12 layers", "H200", "2026-11-27-lease14-h200x4/call5-probe12/qwen3-tp4-probe.tar.xz", "server-q3l12-tp4ep4-lease14-q3-94l-tp4-ep4.log"),
    ("Qwen3 TP4xEP4 48 layers", "H200", "2026-11-27-lease14-h200x4/call6-probe48/qwen3-tp4-probe.tar.xz", "server-q3l48-tp4ep4-lease14-q3-94l-tp4-ep4.log"),
    ("Qwen3 TP4xEP4 94 layers", "H200", "2026-11-27-lease14-h200x4/call4-probe94/qwen3-tp4-probe.tar.xz", "server-q3l94-tp4ep4-lease14-q3-94l-tp4-ep4.log"),
    ("32/2-head TP2xEP2 20 layers", "H200", "2026-11-27-lease17-h200x2/call9-l20/qwen3-tp4-probe.tar.xz", "server-q3l20-tp2ep2-lease17-fa3-q3-tp2-ep2-fa3-lease17.log"),
    ("32/2-head TP2xEP2 40 layers", "H200", "2026-11-27-lease17-h200x2/call10-l40/qwen3-tp4-probe.tar.xz", "server-q3l40-tp2ep2-lease17-fa3-q3-tp2-ep2-fa3-lease17.log"),
]
# PD prefill servers (no decode graphs) started on cold caches, with the scheduler's per-iteration PDO_ITER lines
COLD_PREFILLS = [
    ("V2-Lite bf16", "H100", "2026-11-27-warmup-fix-h100/pd-warmupfix.tar.xz"),  # lease 9
    ("V2-Lite bf16", "H100", "2026-11-27-lease13-h100/call5-pd/pd-warmupfix.tar.xz"),
    ("Qwen3-shaped FP8", "H100", "2026-11-26-qwen3-serve-one-h100/prepare-call8.tar.xz"),
    ("Qwen3-shaped FP8", "H100", "2026-11-26-qwen3-serve-one-h100/prepare-call14.tar.xz"),
    ("Qwen3-shaped FP8", "H200", "2026-11-26-two-gpu-lease2-h200x2/call3-pd-cold-prepare/prepare.tar.xz"),
    ("Qwen3-shaped FP8", "H200", "2026-11-26-two-gpu-lease5-h200x2/call4-qwen3-prepare-serve/prepare-serve.tar.xz"),
    ("Qwen3-shaped FP8", "H200", "2026-11-27-lease11-h200x2/call5-prepare/prepare.tar.xz"),
]
# R1-shaped (6 layers, FP8) servers started on H200 with cold caches: (what, calibration file with the start's
# ready_after_s, its run's index there, the server log: archive or file, member, the flags that set its parallelism)
R1_H200_COLD = [
    ("TP 1, 9 graph sizes", "2026-11-26-dummy-routing-h200/call1/calibration-dummy-graphs.json", 0,
     "2026-11-26-dummy-routing-h200/call1/server-dummy-graphs-dummy-graphs.log", None, []),
    ("TP 2, 8 graph sizes", "2026-11-26-two-gpu-tp2-h200x2/calibration-twogpu-tp2.json.xz", 0,
     "2026-11-26-two-gpu-tp2-h200x2/logs-twogpu-tp2.tar.xz", "server-twogpu-tp2.log",
     ["cluster.gpus_per_node=2", "layout.aggregated.0.tp=2"]),
    ("PP 2, 8 graph sizes", "2026-11-26-two-gpu-h200x2/call1-calibration/calibration-twogpu.json.xz", 1,
     "2026-11-26-two-gpu-h200x2/call1-calibration/logs-twogpu.tar.xz", "server-twogpu-pp2.log",
     ["cluster.gpus_per_node=2", "layout.aggregated.0.pp=2"]),
]
_TIMINGS = re.compile(r"Engine startup timings \(s\): load_weight=([\d.]+), kv_cache_allocation=([\d.]+)")
_WEIGHTS = re.compile(r"Load weight end\. .*?mem usage=([\d.]+) GB")
_POOL = re.compile(r"KV Cache is allocated\. .*?KV size: ([\d.]+) GB|K size: ([\d.]+) GB, V size: ([\d.]+) GB")
_ARGS = re.compile(r"^\[([^\]]+)\] server_args=.*?model_path='([^']+)'.*?load_format='(\w+)'.*?tp_size=(\d+)", re.M)
_ITER = re.compile(r"PDO_ITER .*?run_ms=([0-9.]+)")
_BATCH = re.compile(r"Prefill batch, #new-seq: (\d+), #new-token: (\d+)")
COLD_FIRST_SIZE_S = 30.0  # a first size that long compiled its kernels (warm ones take 0.5-5 s)
_FIRST = re.compile(r"Capturing batches \(bs=\d+[^|]*\|[^|]*\|\s+1/(\d+) \[[\d:]+<[^,]*,\s+([\d.]+)(s/it|it/s)\]")


def read_member(archive: Path, suffix: str) -> str:
    with tarfile.open(archive) as tar:
        stream = tar.extractfile(next(n for n in tar.getnames() if n.endswith(suffix)))
        if stream is None:
            raise SystemExit(f"{archive}: {suffix} is not a file")
        return stream.read().decode("utf-8", errors="replace")


def capture(text: str) -> tuple[int, float, float]:
    """(batch sizes, whole capture s, first size s) of the server's decode graph capture (its last rank's line)."""
    graphs = [g for g in startup(text)["cuda_graphs"] if g.get("capture_s") is not None]
    m = _FIRST.search(text.replace("\r", "\n"))
    if not graphs or not m:
        raise SystemExit("no finished capture with a progress bar in this log")
    rate = float(m.group(2))
    return len(graphs[-1]["bs"]), graphs[-1]["capture_s"], rate if m.group(3) == "s/it" else 1 / rate


def prefill_forwards(text: str) -> list[tuple[bool, int, int, float]]:
    """(after ready, sequences, new tokens, run_batch ms) of every prefill forward: each PDO_ITER times the batch whose
    `Prefill batch` line follows it."""
    out, run_ms, ready = [], None, False
    for line in text.splitlines():
        if "fired up and ready to roll" in line:
            ready = True
        elif m := _ITER.search(line):
            run_ms = float(m.group(1))
        elif (m := _BATCH.search(line)) and run_ms is not None:
            out.append((ready, int(m.group(1)), int(m.group(2)), run_ms))
            run_ms = None
    return out


def committed_logs() -> Iterator[tuple[str, str]]:
    """(where, text) of every server log under benchmarks/results: plain or .xz files and tar archive members."""
    for path in sorted(RESULTS.rglob("*")):
        where = str(path.relative_to(RESULTS))
        if path.name.endswith((".tar.xz", ".tar.gz", ".tgz")):
            with tarfile.open(path) as tar:
                for member in tar.getmembers():
                    stream = tar.extractfile(member) if member.isfile() and member.name.endswith(".log") else None
                    if stream is not None:
                        yield f"{where} {member.name}", stream.read().decode("utf-8", errors="replace")
        elif path.name.endswith(".log"):
            yield where, path.read_text(errors="replace")
        elif path.name.endswith(".log.xz"):
            yield where, lzma.decompress(path.read_bytes()).decode("utf-8", errors="replace")


def weight_and_kv_starts() -> list[tuple[float, float, float | None, float, str]]:
    """(weights GiB per GPU, load_weight s, KV pool GiB, kv_cache_allocation s, where) of every dummy-weight start,
    each start once (the same log is copied into several archives: keyed by its server_args stamp, model and timings)."""
    out, seen = [], set()
    for where, text in committed_logs():
        timings, weights, args = _TIMINGS.search(text), _WEIGHTS.search(text), _ARGS.search(text)
        if not (timings and weights and args) or args.group(3) != "dummy":
            continue
        key = (args.group(1), args.group(2), args.group(4), timings.group(0))
        if key in seen:
            continue
        seen.add(key)
        pool = _POOL.search(text)
        pool_gib = None if pool is None else (float(pool.group(1)) if pool.group(1) else float(pool.group(2)) + float(pool.group(3)))
        out.append((float(weights.group(1)), float(timings.group(1)), pool_gib, float(timings.group(2)), where))
    return out


def r1_h200_cold() -> list[tuple[str, int, float, float, dict[str, float], str]]:
    """(what, graph sizes, measured ready s, measured capture s, the planner's cold start-up phases at that many
    sizes, the lender it names) of each R1-shaped cold start on H200."""
    import json
    rows = []
    for what, calibration, run, log, member, sets in R1_H200_COLD:
        ready = json.loads(read_text(RESULTS / calibration))["runs"][run]["ready_after_s"]
        text = read_member(RESULTS / log, member) if member else (RESULTS / log).read_text()
        sizes, whole, _ = capture(text)
        cfg = load_config(ROOT / "benchmarks/backtest/configs/h200-r1shaped-6l.yaml",
                          ["model.context_length=16384", *sets], paths_from=ROOT)
        model = cost_model_for(cfg, "aggregated", cfg.layout.aggregated[0])
        phases = model.startup_breakdown_s("dummy", jit_cached=False, graph_sizes=sizes)
        rows.append((what, sizes, ready, whole, phases, model.calibration.profile if model.calibration else "none"))
    return rows


def main() -> int:
    rows = []
    print(f"{'shape':<28} {'GPU':<5} {'sizes':>5} {'capture s':>9} {'first s':>7} {'caches':<6} log")
    for shape, gpu, archive, member in LOGS:
        sizes, whole, first = capture(read_member(RESULTS / archive, member))
        caches = "cold" if first >= COLD_FIRST_SIZE_S else "warm"
        rows.append((shape, gpu, sizes, whole, first, caches))
        print(f"{shape:<28} {gpu:<5} {sizes:>5} {whole:>9.2f} {first:>7.2f} {caches:<6} {archive} {member}")
    print("\nmedian cold first size (the compile paid once) and warm capture per size, seconds:")
    for shape, gpu in sorted({(r[0], r[1]) for r in rows}):
        cold = [r[4] for r in rows if r[:2] == (shape, gpu) and r[5] == "cold"]
        warm = [r[3] / r[2] for r in rows if r[:2] == (shape, gpu) and r[5] == "warm"]
        print(f"  {shape:<28} {gpu:<5} cold first size {statistics.median(cold) if cold else float('nan'):6.1f} "
              f"({len(cold)} logs, {min(cold, default=float('nan')):.1f}-{max(cold, default=float('nan')):.1f}); "
              f"warm per size {statistics.median(warm) if warm else float('nan'):5.2f} ({len(warm)} logs)")
    print("\ncold PD prefills: SGLang's warm-up forward before ready | after ready: the first three prompt forwards, then "
          "any other >= 0.5 s (sequences x tokens = run_batch ms):")
    for shape, gpu, archive in COLD_PREFILLS:
        forwards = prefill_forwards(read_member(RESULTS / archive, "prefill-0-0.log"))
        before = [f for f in forwards if not f[0]]
        prompts = [f for f in forwards if f[0] and f[2] > 1]
        shown = prompts[:3] + [f for f in prompts[3:] if f[3] >= 500]
        text = " ".join(f"{n}x{t}={ms:.0f}" for _, n, t, ms in shown)
        print(f"  {shape:<17} {gpu:<5} before {before[-1][1]}x{before[-1][2]}={before[-1][3]:.0f} | {text}  ({archive})")
    starts = weight_and_kv_starts()
    rates = sorted(gib * GIB / GB / s for gib, s, *_ in starts if s > 0)
    allocs = sorted(kv for *_, kv, _ in starts)
    q1, _, q3 = statistics.quantiles(rates, n=4)
    print(f"\nweights and KV pool of {len(starts)} dummy-weight starts (GiB per GPU, load_weight s, KV pool GiB, "
          "kv_cache_allocation s):")
    for gib, s, pool, kv, where in sorted(starts):
        print(f"  {gib:6.2f} GiB {s:5.2f} s ({gib * GIB / GB / s if s else float('nan'):6.1f} GB/s) | KV "
              f"{'   -  ' if pool is None else f'{pool:6.2f}'} GiB {kv:5.2f} s  {where}")
    print(f"  dummy weight init: median {statistics.median(rates):.1f} GB/s over {len(rates)} starts "
          f"(quartiles {q1:.1f}-{q3:.1f}, range {rates[0]:.1f}-{rates[-1]:.1f}); planner's dummy_init_gb_s "
          f"{gpu_spec('H100-SXM').dummy_init_gb_s:g} (H100) / {gpu_spec('H200').dummy_init_gb_s:g} (H200)")
    print(f"  KV allocation: median {statistics.median(allocs):.2f} s over {len(allocs)} starts (range {allocs[0]:.2f}-"
          f"{allocs[-1]:.2f}); planner's GPU default kv_alloc_s {gpu_spec('H100-SXM').kv_alloc_s:g} s")
    print("\nR1-shaped cold starts on H200 (launch -> ready and decode-graph capture, measured | the planner's cold "
          "start-up at the log's graph sizes):")
    for what, _, ready, whole, phases, lender in r1_h200_cold():
        total = sum(phases.values())
        print(f"  {what:<20} ready {ready:6.1f} capture {whole:6.1f} | predicted {total:6.1f} ({100 * (total / ready - 1):+.1f} %), "
              f"capture {phases['cuda_graphs']:6.1f} ({100 * (phases['cuda_graphs'] / whole - 1):+.1f} %): "
              + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()) + f" ({lender})")
    print("\nback-test start-up rows, as the planner predicts them now:")
    for r in run_backtest():
        if r.kind == "startup":
            err = 100 * (float(r.predicted) / float(r.measured) - 1)
            print(f"  {r.id:<60} {r.sample:<3} measured {float(r.measured):6.1f} predicted {float(r.predicted):6.1f} "
                  f"{err:+6.1f}%  bound {'±%.0f%%' % (100 * r.bound) if r.bound is not None else 'none'}  "
                  f"{r.detail.split('; ', 1)[-1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
