"""A fixed CPU work probe at 10 Hz (issue 25, lease 10): is the vCPU itself slower while eager decode steps are slow?

Pinned to one CPU (--cpu), every --interval-s it runs the same pure-Python loop (--loops iterations: interpreter work
of the kind the scheduler's launch path does) and writes one JSON line: t (epoch s), wall_ms and cpu_ms of the loop
(time.thread_time), and that CPU's steal ticks since the previous line (/proc/stat). Inside a VM
a host-side slowdown (a busy sibling hyperthread on the host, lower clocks, steal) stretches wall_ms and cpu_ms
alike with no guest-visible cause; a guest-side cause (run-queue wait, another thread on this CPU) stretches wall_ms
only. Stops on SIGTERM/SIGINT or after --duration-s.

  python3 scripts/device/vcpu_probe.py --cpu 15 --out D/vcpu.jsonl [--interval-s 0.1] [--loops 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path


def steal_ticks(cpu: int) -> int:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            return int(line.split()[8])
    return -1


def work(loops: int) -> int:
    x = 0
    for i in range(loops):
        x += i ^ (x & 1023)
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", type=int, required=True, help="the CPU to pin this probe to")
    ap.add_argument("--out", required=True)
    ap.add_argument("--interval-s", type=float, default=0.1)
    ap.add_argument("--loops", type=int, default=100_000)
    ap.add_argument("--duration-s", type=float, default=0.0, help="0: until SIGTERM")
    args = ap.parse_args(argv)
    if args.cpu not in os.sched_getaffinity(0):
        ap.error(f"--cpu {args.cpu}: not among this process's CPUs {sorted(os.sched_getaffinity(0))}")
    os.sched_setaffinity(0, {args.cpu})
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    end = time.monotonic() + args.duration_s if args.duration_s else float("inf")
    prev_steal = steal_ticks(args.cpu)
    with open(args.out, "a") as out:
        out.write(json.dumps({"kind": "probe", "cpu": args.cpu, "loops": args.loops, "interval_s": args.interval_s,
                              "clk_tck": os.sysconf("SC_CLK_TCK")}) + "\n")
        while not stop and time.monotonic() < end:
            t, w0, c0 = time.time(), time.perf_counter(), time.thread_time()
            work(args.loops)
            wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
            steal = steal_ticks(args.cpu)
            out.write(json.dumps({"t": round(t, 4), "wall_ms": round(wall * 1e3, 3), "cpu_ms": round(cpu * 1e3, 3),
                                  "steal": steal - prev_steal}) + "\n")
            prev_steal = steal
            out.flush()
            time.sleep(max(0.0, args.interval_s - (time.perf_counter() - w0)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
