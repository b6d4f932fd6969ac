"""Host probe run before the engines of a lease: how fast this machine launches, to set beside its eager decode step.

lscpu + nvidia-smi essentials, a fixed Python loop's rate in short windows on chosen vCPUs (the vCPU's speed, which
swings from moment to moment on these VMs: docs/fidelity.md "The slow eager mode measured per step"), and tiny CUDA
kernel launches eager vs replayed from a CUDA graph (launches/s, µs a launch) -> one JSON file + a summary on stdout.
Runs with the device's own python3 (its CUDA torch); without CUDA the launch part records why it was skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

LSCPU_KEYS = ("Model name", "CPU(s)", "Thread(s) per core", "CPU MHz", "CPU max MHz", "BogoMIPS", "Hypervisor vendor")
SMI_FIELDS = ("name", "driver_version", "pstate", "clocks.sm", "clocks.max.sm", "clocks.mem", "power.draw",
              "temperature.gpu", "clocks_event_reasons.active")
LOOP_ITERS = 20_000  # one unit of the Python loop; a window counts whole units


def parse_lscpu(text: str) -> dict[str, str]:
    """lscpu's essentials (LSCPU_KEYS) from its text; keys it lacks are left out."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in LSCPU_KEYS and key.strip() not in out:
            out[key.strip()] = value.strip()
    return out


def parse_smi_csv(text: str) -> list[dict[str, str]]:
    """`nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader` -> one dict per GPU."""
    rows = []
    for line in text.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(SMI_FIELDS):
            raise ValueError(f"nvidia-smi line {line!r}: {len(values)} fields, expected {len(SMI_FIELDS)} ({','.join(SMI_FIELDS)})")
        rows.append(dict(zip(SMI_FIELDS, values)))
    return rows


def window_stats(rates: list[float]) -> dict[str, float]:
    """Spread of per-window rates: median, 5th / 95th percentile and their ratio (x1 = steady)."""
    if len(rates) < 2:
        raise ValueError(f"window_stats: {len(rates)} windows; give the probe at least 2 (raise --python-s or --launches)")
    qs = statistics.quantiles(rates, n=20, method="inclusive")
    p5, p95 = qs[0], qs[-1]
    return {"windows": len(rates), "median": statistics.median(rates), "p5": p5, "p95": p95,
            "min": min(rates), "max": max(rates), "p95_over_p5": p95 / p5 if p5 > 0 else float("inf")}


def python_rate(seconds: float, window_s: float) -> list[float]:
    """Loop units per second in consecutive windows of window_s, for `seconds` on the calling thread's CPU."""
    rates = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start, units = time.perf_counter(), 0
        while (now := time.perf_counter()) - start < window_s:
            total = 0
            for i in range(LOOP_ITERS):
                total += i
            units += 1
        rates.append(units / (now - start))
    return rates


def python_on_cpus(cpus: list[int], seconds: float, window_s: float) -> dict[str, dict]:
    """python_rate pinned to each CPU in turn (the process's own affinity restored after)."""
    out = {}
    before = os.sched_getaffinity(0)
    try:
        for cpu in cpus:
            os.sched_setaffinity(0, {cpu})
            out[str(cpu)] = window_stats(python_rate(seconds, window_s))
    finally:
        os.sched_setaffinity(0, before)
    return out


def cuda_launches(launches: int, windows: int, graph_kernels: int) -> dict:
    """Tiny-kernel launch rate on GPU 0: eager (one add_ per launch, per window) and replayed from a CUDA graph."""
    try:
        import torch
    except ImportError as err:
        return {"skipped": f"no torch: {err}"}
    if not torch.cuda.is_available():
        return {"skipped": "torch.cuda.is_available() is False"}
    x = torch.zeros(1, device="cuda")
    for _ in range(1000):  # warm the launch path
        x.add_(1)
    torch.cuda.synchronize()
    per_window = max(1, launches // windows)
    eager = []
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(per_window):
            x.add_(1)
        torch.cuda.synchronize()
        eager.append(per_window / (time.perf_counter() - start))
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for _ in range(3):
            x.add_(1)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(graph_kernels):
                x.add_(1)
    torch.cuda.synchronize()
    replays = max(1, per_window // graph_kernels)
    graphed = []
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
        graphed.append(replays * graph_kernels / (time.perf_counter() - start))
    e, g = window_stats(eager), window_stats(graphed)
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "launches": per_window * windows,
            "graph_kernels": graph_kernels, "eager_launches_per_s": e, "graph_kernels_per_s": g,
            "eager_us_per_launch": 1e6 / e["median"], "graph_us_per_kernel": 1e6 / g["median"]}


def run_text(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{argv[0]} failed: {err}"


def summary_lines(record: dict) -> list[str]:
    """The probe's one-screen summary (what a lease log shows)."""
    lines = [f"host probe: {record['host'].get('lscpu', {}).get('Model name', '?')}, {record['host']['nproc']} vCPUs, "
             f"kernel {record['host']['kernel']}"]
    for gpu in record["host"].get("gpus", []):
        lines.append(f"  GPU {gpu['name']}: driver {gpu['driver_version']}, SM {gpu['clocks.sm']} (max {gpu['clocks.max.sm']}),"
                     f" {gpu['pstate']}, {gpu['power.draw']}, {gpu['temperature.gpu']} C")
    for cpu, s in record["python"].items():
        lines.append(f"  python loop on CPU {cpu}: median {s['median']:.0f} units/s, p5-p95 {s['p5']:.0f}-{s['p95']:.0f}"
                     f" (x{s['p95_over_p5']:.2f}), {s['windows']} windows")
    cuda = record["cuda"]
    if "skipped" in cuda:
        lines.append(f"  CUDA launches: skipped ({cuda['skipped']})")
    else:
        e, g = cuda["eager_launches_per_s"], cuda["graph_kernels_per_s"]
        lines.append(f"  CUDA eager: {cuda['eager_us_per_launch']:.2f} us a launch ({e['median']:.0f}/s, p5-p95 x{e['p95_over_p5']:.2f});"
                     f" graph replay: {cuda['graph_us_per_kernel']:.2f} us a kernel ({g['median']:.0f}/s)")
    return lines


def probe(args: argparse.Namespace) -> dict:
    nproc = os.cpu_count() or 1
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else sorted({0, nproc // 2, nproc - 1})
    bad = [c for c in cpus if c not in os.sched_getaffinity(0)]
    if bad:
        raise SystemExit(f"--cpus: {bad} not in this process's CPUs {sorted(os.sched_getaffinity(0))}; name CPUs it may run on")
    host = {"nproc": nproc, "kernel": platform.release(), "python": sys.version.split()[0],
            "lscpu": parse_lscpu(run_text(["lscpu"]))}
    governor = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    host["governor"] = governor.read_text().strip() if governor.exists() else None
    smi = run_text(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader"])
    try:
        host["gpus"] = parse_smi_csv(smi) if smi.strip() and "failed" not in smi else []
    except ValueError as err:
        host["gpus"], host["gpus_error"] = [], str(err)
    started = time.time()
    record: dict[str, object] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "host": host,
                                 "python": python_on_cpus(cpus, args.python_s, args.window_s)}
    if args.no_cuda:
        record["cuda"] = {"skipped": "--no-cuda"}
    else:  # on the Python loop's first CPU, so the two rates are the same vCPU's
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpus[0]})
        try:
            record["cuda"] = {"cpu": cpus[0], **cuda_launches(args.launches, args.windows, args.graph_kernels)}
        finally:
            os.sched_setaffinity(0, before)
    record["seconds"] = round(time.time() - started, 2)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--cpus", default="", help="comma-separated CPUs for the Python loop (default: first, middle, last)")
    parser.add_argument("--python-s", type=float, default=2.0, help="seconds of the Python loop on each CPU")
    parser.add_argument("--window-s", type=float, default=0.05, help="one Python-loop window, s")
    parser.add_argument("--launches", type=int, default=20_000, help="eager tiny-kernel launches in all")
    parser.add_argument("--windows", type=int, default=20, help="windows the launches are timed in")
    parser.add_argument("--graph-kernels", type=int, default=100, help="kernels in the replayed CUDA graph")
    parser.add_argument("--no-cuda", action="store_true", help="skip the CUDA launches")
    args = parser.parse_args(argv)
    record = probe(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(summary_lines(record)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
