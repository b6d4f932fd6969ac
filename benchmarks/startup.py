"""Start-up of the embedded default: time from `bench` start to the first measured token, by phase and by engine.

    .venv/bin/python benchmarks/startup.py [--config configs/default.yaml] [--set KEY=VALUE ...]

spawn `python -m orchestrator bench` -> its result.json (phase timestamps from job start, per-request
sent_at + ttft_s) + each engine's log (first line = process up and listening, "fired up" = ready) -> table.
The engine rows show whether prefill and decode start concurrently: their start-to-ready intervals overlap
when they do. Times are wall seconds from the moment this script spawned `bench` (interpreter + imports
included), so run it with engine.sim.time_scale=1 (the default) for real seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from orchestrator.provenance import recorded

ROOT = Path(__file__).resolve().parents[1]
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass
class BenchRun:
    """One `bench` process: when we spawned it, its result.json, and its exit status."""

    spawned_at: float
    result_dir: Path
    result: dict
    exit_code: int
    output: str


def run_bench_cli(config: str, overrides: list[str], result_dir: Path, timeout_s: float = 1800) -> BenchRun:
    """Spawn the real CLI (what a user runs) and read back the result it wrote."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", UCX_NET_DEVICES="lo")
    argv = [sys.executable, "-m", "orchestrator", "bench", "--config", config, "--result-dir", str(result_dir)]
    for o in overrides:
        argv += ["--set", o]
    out_path = result_dir / "bench-output.txt"
    spawned_at = time.time()
    with open(out_path, "w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None:  # the cluster's temp dir (engine logs) is deleted at teardown: copy as we go
            if time.time() - spawned_at > timeout_s:
                proc.terminate()
            copy_engine_logs(result_dir)
            time.sleep(0.5)
    output = out_path.read_text(errors="replace")
    paths = sorted(result_dir.rglob("result.json"), key=lambda p: p.stat().st_mtime)
    if not paths:
        raise SystemExit(f"bench wrote no result.json under {result_dir} (exit {proc.returncode}):\n{output[-3000:]}")
    return BenchRun(spawned_at, result_dir, json.loads(paths[-1].read_text()), proc.returncode, output)


def copy_engine_logs(result_dir: Path) -> None:
    """Copy the run's engine logs (under the local cluster's node temp dirs) into result_dir/engine-logs."""
    try:
        state = json.loads((result_dir / "local-cluster.json").read_text())
    except (OSError, ValueError):
        return
    dest = result_dir / "engine-logs"
    dest.mkdir(exist_ok=True)
    for node in state.get("nodes", []):
        for log in Path(node.get("temp_dir", "/nonexistent")).glob("session_*/logs/pd-engines/*/*.log"):
            try:
                (dest / log.name).write_bytes(log.read_bytes())
            except OSError:
                pass


def job_started_at(run: BenchRun) -> float:
    """Wall time of the job's phase clock zero: first request sent minus its phase offset."""
    results = [r for r in run.result["results"] if r.get("sent_at")]
    measured = next(p for p in run.result["phases"] if p["name"] == "measured run")
    first_sent = min(r["sent_at"] for r in results)
    return first_sent - measured["start_s"]


def first_token_at(run: BenchRun) -> float:
    return min(r["sent_at"] + r["ttft_s"] for r in run.result["results"] if r.get("ttft_s") is not None)


def log_times(path: str) -> tuple[float | None, float | None]:
    """(first log line, 'fired up' line) as wall times; None where the log lacks it."""
    first = ready = None
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None, None
    for line in lines:
        m = LOG_TIME.match(line)
        if not m:
            continue
        t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        first = first if first is not None else t
        if "fired up and ready" in line:
            ready = t
            break
    return first, ready


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/default.yaml",
                        help="a relative path is read from the repository root, where bench runs")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=None, help="results folder: manifest.json + stdout in output.txt")
    args = parser.parse_args()
    with recorded(args.out):
        run = run_bench_cli(args.config, args.overrides, Path(tempfile.mkdtemp(prefix="startup-")))
        if run.result.get("time_unit") != "s":
            print("note: time_scale != 1, phase times are simulated seconds", file=sys.stderr)
        zero = job_started_at(run)
        print(f"Start-up, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.config} "
              f"{' '.join(args.overrides)}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
              f"verdict {run.result['verdict']}, exit {run.exit_code}.\n")
        print("| phase | start s | end s | duration s |")
        print("|---|---|---|---|")
        print(f"| interpreter + imports (spawn -> job clock zero) | {run.spawned_at - zero:.2f} | 0.00 | {zero - run.spawned_at:.2f} |")
        for p in run.result["phases"]:
            print(f"| {p['name']} | {p['start_s']:.2f} | {p['end_s']:.2f} | {p['duration_s']:.2f} |")
        ftt = first_token_at(run)
        print(f"| **first measured token** | | {ftt - zero:.2f} | **{ftt - run.spawned_at:.2f} from spawn** |")
        print("\n| engine | role | process up s | ready s | start-up s |")
        print("|---|---|---|---|---|")
        intervals = []
        for w in run.result["metadata"].get("workers", []):
            up, ready = log_times(str(run.result_dir / "engine-logs" / Path(w.get("log_path") or "?").name))
            if up is None or ready is None:
                print(f"| {w['name']} | {w['role']} | ? | ? | log {w.get('log_path')} has no timestamps |")
                continue
            intervals.append((w["role"], up - zero, ready - zero))
            print(f"| {w['name']} | {w['role']} | {up - zero:.2f} | {ready - zero:.2f} | {ready - up:.2f} |")
        roles = {r for r, _, _ in intervals}
        if {"prefill", "decode"} <= roles:
            pre = [i for i in intervals if i[0] == "prefill"]
            dec = [i for i in intervals if i[0] == "decode"]
            overlap = min(max(e for _, _, e in pre), max(e for _, _, e in dec)) - max(min(s for _, s, _ in pre), min(s for _, s, _ in dec))
            print(f"\nPrefill and decode start-up intervals overlap by {overlap:.2f} s "
                  f"({'concurrent' if overlap > 0 else 'SERIAL'}).")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
