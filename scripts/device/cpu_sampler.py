"""A 1 Hz CPU sampler for the lent machine (stdlib only; issue 25, the in-run eager-step measurement).

Writes JSON lines to --out until SIGTERM/SIGINT (or --duration-s):
- once, {"kind": "host"}: nproc, `lscpu` text, every CPU's thread_siblings_list, /proc/cpuinfo model name;
- every --interval-s, {"kind": "sample"}: wall time `t`; per CPU the /proc/stat tick deltas since the last sample
  (user nice system idle iowait irq softirq steal); per CPU MHz from /proc/cpuinfo; every thread that used CPU
  since the last sample as [pid, tid, comm, delta ticks (utime+stime), last CPU (stat field 39)];
- the first time a pid is seen, {"kind": "proc"}: pid, ppid, comm, cmdline (first 300 characters);
- every --gpu-every samples, {"kind": "gpu"}: `nvidia-smi --query-compute-apps` (which pid holds which GPU).
Ticks are USER_HZ (os.sysconf SC_CLK_TCK, recorded in the host line). Only threads that ran are written, so a
10-minute run stays a few MB before compression. The sampler itself is one more thread that runs (~2-4 % of a core).

Usage: python3 scripts/device/cpu_sampler.py --out $OUT/cpu.jsonl [--interval-s 1] [--duration-s N]
       python3 scripts/device/cpu_sampler.py --out /tmp/x.jsonl --duration-s 2   (dry run anywhere with /proc)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_ticks() -> dict[str, list[int]]:
    """Per-CPU cumulative ticks from /proc/stat (cpuN lines, and the "cpu" total)."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu"):
            name, *vals = line.split()
            out[name] = [int(v) for v in vals[: len(STAT_FIELDS)]]
    return out


def cpu_mhz() -> list[float]:
    mhz = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                mhz.append(round(float(line.split(":")[1]), 0))
    except (OSError, ValueError):
        pass
    return mhz


def thread_stats() -> dict[tuple[int, int], tuple[str, int, int]]:
    """(pid, tid) -> (comm, utime+stime ticks, last CPU) for every thread of every process."""
    out = {}
    for pid_dir in os.scandir("/proc"):
        if not pid_dir.name.isdigit():
            continue
        pid = int(pid_dir.name)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            lpar, rpar = raw.find("("), raw.rfind(")")
            comm, rest = raw[lpar + 1:rpar], raw[rpar + 2:].split()
            # rest[0] is field 3 (state): utime = field 14, stime = 15, processor = 39
            try:
                out[(pid, int(tid))] = (comm, int(rest[11]) + int(rest[12]), int(rest[36]))
            except (IndexError, ValueError):
                continue
    return out


def proc_info(pid: int) -> dict:
    info: dict = {"kind": "proc", "pid": pid}
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        info["comm"] = stat[stat.find("(") + 1:stat.rfind(")")]
        info["ppid"] = int(stat[stat.rfind(")") + 2:].split()[1])
        info["cmdline"] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
    except (OSError, ValueError, IndexError):
        pass
    return info


def host_info() -> dict:
    siblings = {}
    for d in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*")):
        try:
            siblings[d.name] = (d / "topology/thread_siblings_list").read_text().strip()
        except OSError:
            pass
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "")
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        lscpu = f"lscpu failed: {exc}"
    return {"kind": "host", "t": time.time(), "nproc": os.cpu_count(), "clk_tck": os.sysconf("SC_CLK_TCK"),
            "model": model, "siblings": siblings, "lscpu": lscpu, "stat_fields": list(STAT_FIELDS)}


def gpu_apps() -> dict:
    try:
        text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id,used_memory", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        text = f"nvidia-smi failed: {exc}"
    return {"kind": "gpu", "t": time.time(), "apps": text.strip().splitlines()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON-lines file to write")
    ap.add_argument("--interval-s", type=float, default=1.0)
    ap.add_argument("--duration-s", type=float, default=0.0, help="stop after this long (0: until SIGTERM)")
    ap.add_argument("--gpu-every", type=int, default=10, help="nvidia-smi compute apps every N samples (0: never)")
    args = ap.parse_args(argv)
    if args.interval_s <= 0:
        ap.error("--interval-s must be > 0")
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    seen: set[int] = set()
    start = time.monotonic()
    with open(args.out, "a", buffering=1) as out:
        out.write(json.dumps(host_info()) + "\n")
        prev_cpu, prev_thr, n = cpu_ticks(), thread_stats(), 0
        while not stop["now"] and not (args.duration_s and time.monotonic() - start >= args.duration_s):
            time.sleep(args.interval_s)
            cpu, thr, n = cpu_ticks(), thread_stats(), n + 1
            deltas = {c: [a - b for a, b in zip(v, prev_cpu.get(c, v))] for c, v in cpu.items()}
            ran = []
            for key, (comm, ticks, last) in thr.items():
                before = prev_thr.get(key)
                d = ticks - before[1] if before else ticks  # a thread born since the last sample: all its ticks
                if d > 0:
                    ran.append([key[0], key[1], comm, d, last])
                    if key[0] not in seen:
                        seen.add(key[0])
                        out.write(json.dumps(proc_info(key[0])) + "\n")
            out.write(json.dumps({"kind": "sample", "t": round(time.time(), 3), "cpu": deltas, "mhz": cpu_mhz(),
                                  "threads": ran}) + "\n")
            if args.gpu_every and n % args.gpu_every == 1:
                out.write(json.dumps(gpu_apps()) + "\n")
            prev_cpu, prev_thr = cpu, thr
    return 0


if __name__ == "__main__":
    sys.exit(main())
