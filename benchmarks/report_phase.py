"""The report phase of SGLang `bench` runs on lent GPU machines, read from their committed logs (issue 25): the seconds
from the end of the measured run to bench's exit, which plan's deadline budget calls `report`.

    .venv/bin/python benchmarks/report_phase.py

Per run: the device wrapper's `[tag t+Ns] bench configs/...` and `[tag t+Ms] bench exit 0` lines (whole seconds of
the wrapper's clock) give bench's wall; bench's own "Total incl. load + warm-up" is its clock at the end of the
measured run; report = wall - total. This also holds bench's Python start before its clock starts (about 1 s in
the call-11 archive: `.started` 04:06:35, result.json at clock 240.0 = 04:10:36). Only runs that exited 0 and printed
their total count; every one ran 1000 prompts, so the logs cannot tell a per-prompt term from a fixed one.

Second part: what the report phase spends, from the file times and the SGLang log of one run's archive (one H100,
aggregated TP 1, `2026-11-26-sglang-one-h100` call 11).
"""

from __future__ import annotations

import re
import statistics
import sys
import tarfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# every committed device wrapper log with an SGLang bench that exited 0 (listed, so a new lease's log does not move
# the figure without a commit that says so)
LOGS = [
    "2026-11-26-sglang-one-h100/main-agg-call11.log",
    "2026-11-26-sglang-one-h100/main-pd-early-call8.log",
    "2026-11-26-sglang-one-h100/main-pd-nooverlap-call7.log",
    "2026-11-26-two-gpu-lease2-h200x2/call4-pd-serve/main-pd-warm.log",
    "2026-11-26-two-gpu-lease3-h100x2/call4-pd/main-pd.log",
    "2026-11-26-two-gpu-lease3-h100x2/call5-agg/main-agg.log",
    "2026-11-26-two-gpu-lease4-h100x2/call3-agg-ab/main-agg-ab.log",
    "2026-11-26-two-gpu-lease4-h100x2/call4-agg-graphs1024-retry/main-agg-graphs1024-retry.log",
    "2026-11-26-two-gpu-lease4-h100x2/call5-pd-ab/main-pd-ab.log",
    "2026-11-26-two-gpu-lease5-h200x2/call3-eager-ab/main-eager.log",
    "2026-11-27-lease7-h100/call8-agg-h100x1/main-agg.log",
    "2026-11-27-lease13-h100/call5-pd/main-pd.log",
    "2026-11-27-lease13-h100/call6-product/main-product.log",
    "2026-11-27-lease15-h100/call3-product/main-product.log",
]
BREAKDOWN_ARCHIVE = "2026-11-26-sglang-one-h100/bench-agg-call11.tar.xz"
WRAPPER_FILES = {".started", "env.txt", "timeline.txt", "kv_stats-agg_22807.json"}  # the wrapper's, after bench exit

START = re.compile(r"^\[[\w-]+ t\+(\d+)s\] bench configs/(\S+)")
EXIT = re.compile(r"^\[[\w-]+ t\+(\d+)s\] bench exit (\d+)")
TOTAL = re.compile(r"^Total incl\. load \+ warm-up \(s\):\s+([\d.]+)")
ENGINE = re.compile(r"^Engine:\s+(\w+)")
LAYOUT = re.compile(r"^Layout:\s+(\S+)")
PROMPTS = re.compile(r"^Prompts completed / failed / total:\s+\d+ / \d+ / (\d+)")
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] (.*)$")


def report_runs(log: str) -> list[dict]:
    """One row per bench in the wrapper log `log` (relative to benchmarks/results) that exited 0 on SGLang."""
    rows: list[dict] = []
    run: dict = {}
    for line in (RESULTS / log).read_text().splitlines():
        if m := START.match(line):
            run = {"log": log, "config": m.group(2), "start": int(m.group(1))}
        elif m := TOTAL.match(line):
            run["total"] = float(m.group(1))
        elif m := ENGINE.match(line):
            run["engine"] = m.group(1)
        elif m := LAYOUT.match(line):
            run["layout"] = m.group(1)
        elif m := PROMPTS.match(line):
            run["prompts"] = int(m.group(1))
        elif (m := EXIT.match(line)) and "start" in run:
            if m.group(2) == "0" and "total" in run and run.get("engine") == "sglang":
                run["wall"] = int(m.group(1)) - run["start"]
                run["report"] = run["wall"] - run["total"]
                rows.append(run)
            run = {}
    return rows


def all_runs() -> list[dict]:
    return [row for log in LOGS for row in report_runs(log)]


def median_report_s() -> float:
    return statistics.median(r["report"] for r in all_runs())


def breakdown() -> list[tuple[str, str]]:
    """(wall clock, event) of call 11's report phase: the archive's file times and its SGLang log's shutdown lines."""
    events: list[tuple[str, str]] = []
    with tarfile.open(RESULTS / BREAKDOWN_ARCHIVE) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.split("/")[-1] not in WRAPPER_FILES:
                stamp = datetime.fromtimestamp(member.mtime, tz=timezone.utc).strftime("%H:%M:%S")
                events.append((stamp, f"file last written: {member.name.split('/')[-1]}"))
        log = tar.extractfile("agg/scrape/aggregated-0-0.log").read().decode(errors="replace")  # type: ignore[union-attr]
    for line in log.splitlines():
        m = STAMP.match(line)
        if m and any(k in m.group(2) for k in ("SIGTERM", "SIGQUIT", "crashed", "Sleeping")):
            events.append((m.group(1)[11:], f"SGLang: {m.group(2)[:90]}"))
    last = [m.group(1)[11:] for line in log.splitlines() if (m := STAMP.match(line))][-1]
    events.append((last, "SGLang: its log's last stamped line"))
    return sorted(set(events))


def main() -> int:
    runs = all_runs()
    print(f"{'log':<82} {'layout':<14} {'prompts':>7} {'wall s':>7} {'total s':>8} {'report s':>8}")
    for r in runs:
        print(f"{r['log']:<82} {r.get('layout', '?'):<14} {r.get('prompts', 0):>7} {r['wall']:>7} {r['total']:>8.2f} "
              f"{r['report']:>8.2f}")
    reports = sorted(r["report"] for r in runs)
    print(f"\n{len(runs)} SGLang bench runs that exited 0: report phase median {statistics.median(reports):.1f} s "
          f"(min {reports[0]:.1f}, max {reports[-1]:.1f}; the wrapper's clock has whole seconds)")
    print(f"\nCall 11's report phase (measured run ended at bench clock 239.98 s; {BREAKDOWN_ARCHIVE}):")
    for stamp, event in breakdown():
        if stamp >= "04:10:35":
            print(f"  {stamp}  {event}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
