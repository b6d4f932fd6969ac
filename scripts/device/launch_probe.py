"""The host probe's launch timing as a 10 Hz series beside a running server (issue 25, heager): is the launch path of
another vCPU slower while the scheduler's eager steps are slow?

host_probe.py times the launches once, before the engines; one probe at a lease's start does not pin down the host's
launch speed (it swung x1.5 between probes on one idle machine). This runs during the eager stretch instead: pinned to
one CPU (--cpu), every --interval-s it runs vcpu_probe's fixed Python loop (wall and CPU ms) and then enqueues
--launches tiny kernels (`x.add_(1)` on a 1-element tensor) on GPU 0, timing the enqueue alone (the CPU side of a
launch, what bounds the scheduler's eager step); the synchronize that follows is timed apart (`sync_ms`: the GPU
queue, shared with the server). One JSON line a tick: t (epoch s), loop_wall_ms, loop_cpu_ms, launch_us (mean per
launch), sync_ms, steal (that CPU's ticks since the previous line). Stops on SIGTERM/SIGINT or after --duration-s.

  python3 scripts/device/launch_probe.py --cpu 15 --out D/launch.jsonl [--interval-s 0.1] [--launches 100] [--loops 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vcpu_probe import steal_ticks, work


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", type=int, required=True, help="the CPU to pin this probe to (not the scheduler's)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval-s", type=float, default=0.1)
    ap.add_argument("--launches", type=int, default=100, help="tiny kernels enqueued per tick")
    ap.add_argument("--loops", type=int, default=20_000, help="iterations of the fixed Python loop per tick")
    ap.add_argument("--duration-s", type=float, default=0.0, help="0: until SIGTERM")
    args = ap.parse_args(argv)
    if args.cpu not in os.sched_getaffinity(0):
        ap.error(f"--cpu {args.cpu}: not among this process's CPUs {sorted(os.sched_getaffinity(0))}")
    if args.launches < 1:
        ap.error(f"--launches {args.launches}: give at least 1 kernel a tick")
    os.sched_setaffinity(0, {args.cpu})
    import torch
    if not torch.cuda.is_available():
        ap.error("no CUDA device: this probe times kernel launches on GPU 0")
    x = torch.zeros(1, device="cuda")
    for _ in range(1000):  # warm the launch path
        x.add_(1)
    torch.cuda.synchronize()
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    end = time.monotonic() + args.duration_s if args.duration_s else float("inf")
    prev_steal = steal_ticks(args.cpu)
    with open(args.out, "a") as out:
        out.write(json.dumps({"kind": "launch_probe", "cpu": args.cpu, "loops": args.loops, "launches": args.launches,
                              "interval_s": args.interval_s, "device": torch.cuda.get_device_name(0)}) + "\n")
        while not stop and time.monotonic() < end:
            t, w0, c0 = time.time(), time.perf_counter(), time.thread_time()
            work(args.loops)
            w1, c1 = time.perf_counter(), time.thread_time()
            for _ in range(args.launches):
                x.add_(1)
            w2 = time.perf_counter()
            torch.cuda.synchronize()
            w3 = time.perf_counter()
            steal = steal_ticks(args.cpu)
            out.write(json.dumps({"t": round(t, 4), "loop_wall_ms": round((w1 - w0) * 1e3, 3),
                                  "loop_cpu_ms": round((c1 - c0) * 1e3, 3),
                                  "launch_us": round((w2 - w1) * 1e6 / args.launches, 3),
                                  "sync_ms": round((w3 - w2) * 1e3, 3), "steal": steal - prev_steal}) + "\n")
            prev_steal = steal
            out.flush()
            time.sleep(max(0.0, args.interval_s - (time.perf_counter() - w0)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
