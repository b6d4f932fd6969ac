"""Profile an SGLang scheduler during its eager decode stretch with py-spy (issue 25, lease 7, the "O7" profile).

Watches server logs (a glob: the product's engine logs appear only once the cluster runs) for the first `Decode batch`
line with `cuda graph: False` and at least --min-running requests, then, on the scheduler process (comm
`sglang::scheduler`, on --gpu where several run; or the one under --server-pid):
  threads-1.json   every thread of it and of every busy process on the host: name, CPU share over 1 s, wchan
  dump-1.txt       `py-spy dump --native` of the scheduler (every Python thread, with native frames)
  busy-<pid>.txt   `py-spy dump --native` of every other Python process above --busy-share of a core (≤ 6)
  record.raw       `py-spy record --native --threads --idle -r RATE -f raw -d SECONDS` of the scheduler
  dump-2.txt, dump-3.txt, threads-2.json   the same after the record
  meta.json        trigger line, pids, the commands with their exit codes, stderr tails, wall-clock of the record
Writes into --out; a watch that never sees an eager line ends at --timeout-s with meta.json saying so.

Usage: python3 scripts/device/eager_pyspy.py --log-glob 'D/*.log' --out D/pyspy --pyspy /root/pyspy/py-spy \
         [--gpu 1] [--server-pid PID] [--min-running 300] [--record-s 10] [--rate 100] [--dumps 3] [--timeout-s 300]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from orchestrator.calibrate.logparse import decode_lines  # noqa: E402

SCHEDULER_COMM = "sglang::schedul"   # /proc comm is cut at 15 characters


def eager_trigger(text: str, min_running: int) -> dict | None:
    """The first decode line that ran eager (no CUDA graph) with at least `min_running` requests."""
    for row in decode_lines(text):
        if not row["cuda_graph"] and row["running"] >= min_running and row["ranks"] in ("", "TP0"):
            return row
    return None


def proc_stat(pid: int | str, tid: int | str | None = None) -> tuple[str, int] | None:
    """(comm, utime + stime ticks) of a process or one of its threads."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat"
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return comm, int(fields[11]) + int(fields[12])


def read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def schedulers() -> list[int]:
    return sorted(int(d) for d in os.listdir("/proc") if d.isdigit() and (s := proc_stat(d)) and s[0].startswith(SCHEDULER_COMM))


def gpu_of_pids() -> dict[int, int]:
    """pid -> GPU index from nvidia-smi (empty without it)."""
    try:
        run = lambda q: subprocess.run(["nvidia-smi", q, "--format=csv,noheader"], capture_output=True, text=True,  # noqa: E731
                                       timeout=15).stdout
        index = {u.strip(): int(i) for i, u in (line.split(",") for line in run("--query-gpu=index,uuid").splitlines() if "," in line)}
        apps = [line.split(",") for line in run("--query-compute-apps=pid,gpu_uuid").splitlines() if "," in line]
        return {int(p): index[u.strip()] for p, u in apps if p.strip().isdigit() and u.strip() in index}
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}


def descendants(pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            text = read(f"/proc/{d}/stat")
            if ")" in text:
                kids.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        todo += kids.get(p, [])
    return out


def pick_scheduler(gpu: int | None, server_pid: int | None) -> tuple[int | None, str]:
    found = schedulers()
    if server_pid:
        found = [p for p in found if p in descendants(server_pid)] or found
    if gpu is not None and len(found) > 1:
        on = gpu_of_pids()
        found = [p for p in found if on.get(p) == gpu] or found
    if found:
        return found[0], f"comm {SCHEDULER_COMM} ({len(found)} candidates)"
    on = gpu_of_pids()
    pids = sorted(p for p, g in on.items() if gpu is None or g == gpu)
    return (pids[0], "nvidia-smi compute app") if pids else (None, "no scheduler found")


def threads_snapshot(window_s: float = 1.0) -> dict:
    """Every thread of every process on the host: name and the share of a core it used over `window_s`; kept
    where > 2 %, plus wchan and the current syscall number of those."""
    def ticks() -> dict[tuple[int, int], tuple[str, int]]:
        out = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                tids = os.listdir(f"/proc/{d}/task")
            except OSError:
                continue
            for t in tids:
                if s := proc_stat(d, t):
                    out[(int(d), int(t))] = s
        return out
    hz = os.sysconf("SC_CLK_TCK")
    first = ticks()
    t0 = time.monotonic()
    time.sleep(window_s)
    second = ticks()
    dt = time.monotonic() - t0
    rows = []
    for key, (name, used) in second.items():
        share = (used - first.get(key, (name, used))[1]) / hz / dt
        if share > 0.02:
            pid, tid = key
            rows.append({"pid": pid, "tid": tid, "name": name, "process": (proc_stat(pid) or ("?", 0))[0],
                         "core_share": round(share, 3), "wchan": read(f"/proc/{pid}/task/{tid}/wchan"),
                         "syscall": read(f"/proc/{pid}/task/{tid}/syscall").split(" ")[0]})
    return {"t": time.time(), "window_s": round(dt, 3), "threads": sorted(rows, key=lambda r: -r["core_share"])}


def busy_processes(snapshot: dict, share: float) -> list[int]:
    per_pid: dict[int, float] = {}
    for row in snapshot["threads"]:
        per_pid[row["pid"]] = per_pid.get(row["pid"], 0.0) + row["core_share"]
    return [p for p, s in sorted(per_pid.items(), key=lambda x: -x[1]) if s >= share]


def run_pyspy(argv: list[str], timeout_s: float, stdout_path: Path | None) -> dict:
    t0 = time.time()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        if stdout_path is not None:
            stdout_path.write_text(p.stdout)
        return {"argv": argv, "rc": p.returncode, "t0": round(t0, 3), "t1": round(time.time(), 3),
                "stderr": p.stderr[-1500:]}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"argv": argv, "rc": None, "t0": round(t0, 3), "t1": round(time.time(), 3), "error": f"{type(exc).__name__}: {exc}"}


def tail_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def watch(log_glob: str, min_running: int, timeout_s: float, poll_s: float = 0.5) -> tuple[dict | None, str | None]:
    """Wait for the eager trigger in any file the glob matches, in what was written after the watch began (a lone
    server's log holds earlier rounds); files re-read from there on every poll (SGLang logs stay small)."""
    start = {p: os.path.getsize(p) for p in glob.glob(log_glob) if os.path.isfile(p)}
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for path in sorted(glob.glob(log_glob)):
            row = eager_trigger(tail_from(path, start.get(path, 0)), min_running)
            if row:
                return row, path
        time.sleep(poll_s)
    return None, None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-glob", required=True, help="server log file(s) to watch for the first eager decode line")
    ap.add_argument("--out", required=True)
    ap.add_argument("--pyspy", required=True, help="the py-spy binary")
    ap.add_argument("--gpu", type=int, help="where several schedulers run: the one on this GPU index")
    ap.add_argument("--server-pid", type=int, help="prefer a scheduler under this process")
    ap.add_argument("--min-running", type=int, default=300)
    ap.add_argument("--record-s", type=int, default=10, help="whole seconds (py-spy's -d takes an integer)")
    ap.add_argument("--rate", type=int, default=100)
    ap.add_argument("--dumps", type=int, default=3)
    ap.add_argument("--busy-share", type=float, default=0.3, help="dump other processes above this share of a core")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    args = ap.parse_args(argv)
    if args.record_s <= 0 or args.rate <= 0 or args.timeout_s <= 0 or args.min_running < 1 or args.dumps < 0:
        ap.error("--record-s, --rate, --timeout-s and --min-running must be positive, --dumps not negative")
    if not (os.path.isfile(args.pyspy) and os.access(args.pyspy, os.X_OK)):
        ap.error(f"--pyspy: {args.pyspy} is not an executable file (unpack the carried py-spy wheel first)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta: dict = {"log_glob": args.log_glob, "min_running": args.min_running, "started": round(time.time(), 3), "calls": []}

    def save() -> None:
        (out / "meta.json").write_text(json.dumps(meta, indent=1))
    trigger, path = watch(args.log_glob, args.min_running, args.timeout_s)
    meta.update(trigger=trigger, trigger_log=path, triggered_at=round(time.time(), 3))
    if trigger is None:
        meta["error"] = f"no eager decode line with >= {args.min_running} running within {args.timeout_s} s"
        save()
        print(meta["error"], flush=True)
        return 1
    pid, how = pick_scheduler(args.gpu, args.server_pid)
    meta.update(scheduler_pid=pid, found_by=how, gpu_of_pids={str(k): v for k, v in gpu_of_pids().items()})
    if pid is None:
        meta["error"] = "no scheduler process"
        save()
        return 1
    print(f"eager line {trigger['running']} running at {trigger['t']}: scheduler {pid} ({how})", flush=True)
    dump = [args.pyspy, "dump", "--native", "--pid", str(pid)]
    snap = threads_snapshot()
    (out / "threads-1.json").write_text(json.dumps(snap, indent=1))
    if args.dumps:
        meta["calls"].append(run_pyspy(dump, 30, out / "dump-1.txt"))
    for other in [p for p in busy_processes(snap, args.busy_share) if p != pid][:6]:
        meta["calls"].append(run_pyspy([args.pyspy, "dump", "--native", "--pid", str(other)], 30, out / f"busy-{other}.txt"))
    save()
    record = [args.pyspy, "record", "--native", "--threads", "--idle", "-r", str(args.rate), "-f", "raw",
              "-d", str(args.record_s), "-o", str(out / "record.raw"), "--pid", str(pid)]
    meta["calls"].append(run_pyspy(record, args.record_s + 60, None))
    meta["record"] = {"t0": meta["calls"][-1]["t0"], "t1": meta["calls"][-1]["t1"], "rc": meta["calls"][-1]["rc"]}
    save()
    for i in range(2, args.dumps + 1):
        meta["calls"].append(run_pyspy(dump, 30, out / f"dump-{i}.txt"))
    (out / "threads-2.json").write_text(json.dumps(threads_snapshot(), indent=1))
    meta["ended"] = round(time.time(), 3)
    save()
    print(f"py-spy: {[c['rc'] for c in meta['calls']]} (exit codes), record {meta['record']}", flush=True)
    return 0 if meta["record"]["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
