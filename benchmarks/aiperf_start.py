"""AIPerf 0.12.0's own start-up (process start -> its first phase starts) against --num-dataset-entries.

Runs the contest's `aiperf profile` command (orchestrator/run/aiperf.py, ISL 4000 / OSL 200, Qwen's tokenizer) with
a 1 s window against a port nothing listens on: everything before the first request (tokenizer prefetch, services,
the synthetic dataset) is the same as against a gateway, and the requests then fail at once. Reads AIPerf's own log
(logs/aiperf.log): the first line, `Dataset configured in X seconds`, and the first `Phase ... started`.

    .venv/bin/python benchmarks/aiperf_start.py [--entries 256 12800] [--repeats 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.cluster.ports import free_port  # noqa: E402
from orchestrator.run.aiperf import ClosedLoad, aiperf_env, find_aiperf, profile_command  # noqa: E402

MODEL = "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"
STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)"


def _at(line: str) -> float:
    match = re.match(STAMP, line)
    assert match is not None, line
    return datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()


def start_seconds(log: str) -> tuple[float, float]:
    """(AIPerf's first log line -> its first phase started, the dataset's own `configured in` seconds) of one log."""
    lines = [line for line in log.splitlines() if re.match(STAMP, line)]
    phase = next(line for line in lines if re.search(r"Phase \w+ \(\w+\) started", line))
    dataset = re.search(r"Dataset configured in ([\d.]+) seconds", log)
    assert dataset is not None, "no 'Dataset configured in' line"
    return _at(phase) - _at(lines[0]), float(dataset.group(1))


def run_once(entries: int, out_dir: Path) -> tuple[float, float]:
    load = ClosedLoad(url=f"http://127.0.0.1:{free_port()}", model=MODEL, concurrency=4, warmup_s=0, window_s=1,
                      grace_s=0, num_dataset_entries=entries)
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "aiperf.out").open("wb") as log:
        subprocess.run(profile_command(find_aiperf(), load, out_dir), stdout=log, stderr=subprocess.STDOUT,
                       env=aiperf_env(os.environ), timeout=900, cwd=out_dir)
    return start_seconds((out_dir / "logs" / "aiperf.log").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[256, 12800])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep AIPerf's artifact directories here")
    args = parser.parse_args()
    base = args.out or Path(tempfile.mkdtemp(prefix="aiperf-start-"))
    print(f"{'entries':>8} {'run':>4} {'start s':>8} {'dataset s':>10}")
    for repeat in range(args.repeats):
        for entries in args.entries:
            start_s, dataset_s = run_once(entries, base / f"e{entries}-r{repeat}")
            print(f"{entries:>8} {repeat:>4} {start_s:>8.1f} {dataset_s:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
