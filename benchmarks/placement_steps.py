"""Where the simulated engine's placement goes on this machine: `bench` on the embedded default, run after run, each
run's placement steps (result.json's metadata.placement_steps) beside the host's load average.

    .venv/bin/python benchmarks/placement_steps.py --runs 4 --out DIR [--running-cluster]

Each run starts its own local 2-node cluster (cluster.address: local), as the README's first command does; with
--running-cluster the script starts one first (`cluster up --local`), every run attaches to it, and it is stopped at
the end. The engines' modelled start-up (engine.sim.startup_s=1) and the batch (50 prompts) are cut short: neither
is part of placement, which ends once every replica is constructed (the sim servers' processes are launched, not
yet ready). The 1-minute load average is read just before each run: other work on a shared 2-core box stretches
every step, so a figure is read against the load it ran under.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "orchestrator", "bench", "--config", "configs/default.yaml", "--quiet",
         "--set", "engine.sim.startup_s=1", "--set", "benchmark.num_prompts=50"]


def one_run(out: Path, index: int) -> dict:
    """Run bench once; its placement phase, steps and the load average before it."""
    result_dir = out / "runs"
    load = os.getloadavg()[0]
    started = time.strftime("%H:%M:%S", time.gmtime())
    proc = subprocess.run([*BENCH, "--result-dir", str(result_dir)], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run {index}: bench exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    path = next(line.split(":", 1)[1].strip() for line in proc.stdout.splitlines() if line.startswith("result:"))
    doc = json.loads((ROOT / path).read_text())  # an absolute path stays itself
    placement = next(p for p in doc["phases"] if p["name"] == "placement")
    steps = {s["name"]: s["duration_s"] for s in doc["metadata"]["placement_steps"]}
    return {"run": index, "started_utc": started, "load_1min": round(load, 2), "placement_s": placement["duration_s"],
            "steps": steps, "run_id": doc["run_id"]}


def table(rows: list[dict]) -> str:
    names = list(dict.fromkeys(name for r in rows for name in r["steps"]))
    head = f"{'run':>3} {'UTC':>8} {'load':>5} {'placement':>9}  " + "  ".join(f"{n:>16}" for n in names)
    lines = [head]
    for r in rows:
        cells = "  ".join(f"{r['steps'].get(n, float('nan')):>16.2f}" for n in names)
        lines.append(f"{r['run']:>3} {r['started_utc']:>8} {r['load_1min']:>5.2f} {r['placement_s']:>9.2f}  {cells}")
    for label, pick in (("median", statistics.median), ("min", min), ("max", max)):
        cells = "  ".join(f"{pick([r['steps'][n] for r in rows if n in r['steps']]):>16.2f}" for n in names)
        lines.append(f"{label:>3} {'':>8} {'':>5} {pick([r['placement_s'] for r in rows]):>9.2f}  {cells}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True, help="folder for the runs' result.json files")
    parser.add_argument("--running-cluster", action="store_true", help="start the cluster once, before the runs")
    args = parser.parse_args()
    state = args.out / "runs" / "local-cluster.json"  # where bench looks for a cluster already up
    cluster = [sys.executable, "-m", "orchestrator", "cluster"]
    if args.running_cluster:
        subprocess.run([*cluster, "up", "--local", "--state", str(state)], cwd=ROOT, check=True, capture_output=True)
    try:
        rows = []
        for i in range(1, args.runs + 1):
            rows.append(one_run(args.out, i))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if args.running_cluster:
            subprocess.run([*cluster, "down", "--state", str(state)], cwd=ROOT, capture_output=True)
    how = "a cluster already up" if args.running_cluster else "each run starting its own local cluster"
    print(f"\nbench on configs/default.yaml, {how}; seconds; load = 1-minute load average before the run "
          f"({os.cpu_count()} cores)")
    print(table(rows))


if __name__ == "__main__":
    main()
