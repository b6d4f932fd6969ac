"""The serve+goodput job's AIPerf allowance per declared N: each AIPerf run as measured over what the job predicts.

The one-H100 Qwen3 lease (benchmarks/results/2026-11-26-qwen3-serve-one-h100) ran the contest's AIPerf command six
times (N = 4 and 16; our gateway twice, sglang-router once; 256 dataset entries, warm-up 10 s, window 30 s, grace
10 s); each run's AIPerf log and phase manifest are in its archives. Per run: its wall (AIPerf's first to last log
line), its start-up (first line -> warm-up phase started) and its dataset's own `configured in` seconds. The job
predicts a run as AIPerf's start-up + aiperf_phases_s (warm-up + window + the two waits for requests in flight, from
`plan`'s output tok/s at N for the lease's config); the worst measured/predicted ratio is the factor
orchestrator/cli/jobscript.py scales the prediction by (in-sample: these are the only runs). The start-up at more
dataset entries grows by the dataset's own seconds times how much longer AIPerf built 12,800 entries than 256 on this
VM (aiperf_start.txt, benchmarks/aiperf_start.py).

    .venv/bin/python benchmarks/aiperf_allowance.py
"""

from __future__ import annotations

import datetime
import json
import math
import re
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.cluster.jobscript import aiperf_phases_s  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.plan.closedloop.predict import predict_closed_loop  # noqa: E402

LEASE = ROOT / "benchmarks" / "results" / "2026-11-26-qwen3-serve-one-h100"
CONFIG = ROOT / "configs" / "device-h100x1-qwen3-serve.yaml"
LOCAL_START = ROOT / "benchmarks" / "results" / "2026-11-27-aiperf-allowance" / "aiperf_start.txt"
ARCHIVES = (("run 1, our gateway", "serve-call9.tar.xz"), ("sglang-router", "router-call10.tar.xz"),
            ("run 2, our gateway", "serve-call15.tar.xz"))
# the lease's AIPerf command (its README): 256 entries, ISL 4000 / OSL 200, warm-up 10 s, window 30 s, grace 10 s
ENTRIES, OSL, WARMUP_S, WINDOW_S, GRACE_S = 256, 200, 10.0, 30.0, 10.0
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) ")


def _at(line: str) -> float:
    match = STAMP.match(line)
    assert match is not None, line
    return datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()


def lease_runs() -> list[dict]:
    """One row per AIPerf run of the lease: where, N, wall, start-up and dataset seconds, from its own files."""
    rows = []
    for where, archive in ARCHIVES:
        with tarfile.open(LEASE / archive) as tar:
            logs = sorted((m for m in tar.getmembers() if m.name.endswith("/logs/aiperf.log")),
                          key=lambda m: int(m.name.split("/c")[-1].split("/")[0]))
            for member in logs:
                n = int(member.name.split("/c")[-1].split("/")[0])
                log = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
                manifest = json.loads(tar.extractfile(member.name.replace("logs/aiperf.log", "phase_manifest.json"))
                                      .read())  # type: ignore[union-attr]
                lines = [line for line in log.splitlines() if STAMP.match(line)]
                first = _at(lines[0])
                warmup_ns = min(p["start_ns"] for p in manifest["phases"])
                dataset = re.search(r"Dataset configured in ([\d.]+) seconds", log)
                assert dataset is not None, member.name
                rows.append({"where": where, "n": n, "wall_s": _at(lines[-1]) - first,
                             "start_s": warmup_ns / 1e9 - first, "dataset_s": float(dataset.group(1))})
    return rows


def local_dataset_growth(path: Path = LOCAL_START) -> tuple[float, list[tuple[int, float, float]]]:
    """The most dataset(12,800) / dataset(256) seconds over the repeats of benchmarks/aiperf_start.py's output, and
    its rows (entries, start s, dataset s)."""
    rows = [(int(e), float(s), float(d)) for e, _, s, d in
            (line.split() for line in path.read_text().splitlines()[1:] if line.strip() and line.split()[0].isdigit())]
    small = [d for e, _, d in rows if e == 256]
    large = [d for e, _, d in rows if e == 12800]
    assert len(small) == len(large) >= 2, rows
    return max(b / a for a, b in zip(small, large)), rows


def predicted(start_s: float, n: int, output_tok_s: float) -> float:
    return start_s + aiperf_phases_s(WARMUP_S, WINDOW_S, GRACE_S, n, OSL, output_tok_s)


def ratios() -> tuple[list[dict], float, float]:
    """(the lease's runs with predicted seconds and ratio, the start-up used (the most of the six), dataset seconds
    (the most of the six)) against today's plan for CONFIG."""
    runs = lease_runs()
    cfg = load_config(CONFIG)
    tok_s = {p.concurrency: p.output_tok_s for p in predict_closed_loop(cfg, sorted({r["n"] for r in runs})).points}
    start_s = max(r["start_s"] for r in runs)
    for r in runs:
        r["plan_tok_s"] = tok_s[r["n"]]
        r["predicted_s"] = predicted(start_s, r["n"], tok_s[r["n"]])
        r["ratio"] = r["wall_s"] / r["predicted_s"]
    return runs, start_s, max(r["dataset_s"] for r in runs)


def worst_ratio(runs: list[dict]) -> float:
    """The largest measured/predicted ratio, rounded up to 0.01 (the factor the allowance uses)."""
    return max(math.ceil(round(r["ratio"], 6) * 100) / 100 for r in runs)


def main() -> None:
    runs, start_s, dataset_s = ratios()
    growth, local = local_dataset_growth()
    print(f"config {CONFIG.relative_to(ROOT)}; AIPerf 0.12.0, {ENTRIES} entries, warm-up {WARMUP_S:g} s, window "
          f"{WINDOW_S:g} s, grace {GRACE_S:g} s, OSL {OSL}; plan: predict_closed_loop output tok/s at N")
    print(f"{'run':<20} {'N':>3} {'wall s':>7} {'start s':>8} {'dataset s':>9} {'plan tok/s':>10} {'predicted s':>11} "
          f"{'measured/predicted':>18}")
    for r in runs:
        print(f"{r['where']:<20} {r['n']:>3} {r['wall_s']:>7.2f} {r['start_s']:>8.2f} {r['dataset_s']:>9.2f} "
              f"{r['plan_tok_s']:>10.1f} {r['predicted_s']:>11.2f} {r['ratio']:>18.3f}")
    print(f"AIPerf start-up at {ENTRIES} entries: the most of {len(runs)} runs, {start_s:.2f} s; its dataset: the most, "
          f"{dataset_s:.2f} s")
    print(f"worst measured/predicted {worst_ratio(runs):.2f} (in-sample, {len(runs)} runs)")
    print(f"this VM (aiperf_start.txt): dataset seconds at 12,800 / 256 entries, the most of {len(local) // 2} "
          f"repeats: {growth:.2f}")


if __name__ == "__main__":
    main()
