"""Decode CUDA-graph capture at start-up, by layer shape and GPU, from the SGLang logs on record; the cold PD prefills'
first forwards after ready, by shape; then the back-test's start-up rows as the planner predicts them now (issue 25,
hstart).

    .venv/bin/python benchmarks/startup_capture_by_shape.py

Per start-up log: the shape, the GPU, how many batch sizes were captured, the whole capture (SGLang's "Capture cuda
graph end. elapsed=") and its first size (the progress bar's rate after 1 of N): >= 30 s is a compile (cold Triton
cache), else warm. Then, per shape and GPU, the median cold first size and the median warm capture per size: the
figures the planner's start-up lending uses (perfmodel/calibration_lookup.py) are set beside them. Per cold PD prefill
log (PDO_ITER lines): SGLang's own warm-up forward before ready, and after ready the first three forwards carrying a
prompt (more than one token) and any other of >= 0.5 s, as sequences x tokens = run_batch ms.
"""

from __future__ import annotations

import re
import statistics
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.calibrate.logparse import startup  # noqa: E402
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


def main() -> int:
    rows = []
    print(f"{'shape':<22} {'GPU':<5} {'sizes':>5} {'capture s':>9} {'first s':>7} {'caches':<6} log")
    for shape, gpu, archive, member in LOGS:
        sizes, whole, first = capture(read_member(RESULTS / archive, member))
        caches = "cold" if first >= COLD_FIRST_SIZE_S else "warm"
        rows.append((shape, gpu, sizes, whole, first, caches))
        print(f"{shape:<22} {gpu:<5} {sizes:>5} {whole:>9.2f} {first:>7.2f} {caches:<6} {archive} {member}")
    print("\nmedian cold first size (the compile paid once) and warm capture per size, seconds:")
    for shape, gpu in sorted({(r[0], r[1]) for r in rows}):
        cold = [r[4] for r in rows if r[:2] == (shape, gpu) and r[5] == "cold"]
        warm = [r[3] / r[2] for r in rows if r[:2] == (shape, gpu) and r[5] == "warm"]
        print(f"  {shape:<22} {gpu:<5} cold first size {statistics.median(cold) if cold else float('nan'):6.1f} "
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
