"""`goodput`: the 2026 contest's closed-loop AIPerf command against a gateway, once per declared concurrency N.

Each N is one real `aiperf profile` run (orchestrator/run/aiperf.py) with the official settings unless overridden
(ISL 4000 / OSL 200, warm-up 60 s, window 120 s, grace 30 s, 12,800 entries, seed 2026, goodput TTFT 3000 ms /
ITL 20 ms). Per N: output tok/s, good output tok/s, good fraction, TTFT/ITL p50/p90/p99 and the gate verdict
(good fraction >= 0.90); the score is the best good output tok/s among the N that clear the gate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from orchestrator.run.aiperf import (AIPERF_VERSION, AiperfTool, ClosedLoad, ProfileStopped, ProfileSummary, run_profile,
                                     stop_on_signal, stopped_tally)

MIN_GOOD_FRACTION = 0.90


@dataclass(frozen=True)
class GoodputRow:
    concurrency: int
    summary: ProfileSummary
    artifact_dir: Path
    min_good_fraction: float = MIN_GOOD_FRACTION

    @property
    def clears_gate(self) -> bool:
        return self.summary.good_fraction >= self.min_good_fraction

    def as_json(self) -> dict:
        s = self.summary
        return {"concurrency": self.concurrency, "output_tok_s": s.output_tok_s,
                "good_output_tok_s": s.good_output_tok_s, "good_fraction": s.good_fraction,
                "ttft_ms": s.ttft_ms, "itl_ms": s.itl_ms, "requests": s.request_count, "errors": s.error_count,
                "input_tokens_avg": s.input_tokens_avg, "output_tokens_avg": s.output_tokens_avg,
                "clears_gate": self.clears_gate, "artifact_dir": str(self.artifact_dir)}


def best_row(rows: list[GoodputRow]) -> GoodputRow | None:
    """The scoring point: the highest good output tok/s among the rows that clear the gate."""
    passing = [r for r in rows if r.clears_gate]
    return max(passing, key=lambda r: r.summary.good_output_tok_s) if passing else None


def run_goodput(tool: AiperfTool, load: ClosedLoad, concurrencies: list[int], out_dir: Path,
                say: Callable[[str], None] = print) -> list[GoodputRow]:
    """One AIPerf run per N (in the order given), each in out_dir/c<N>; goodput.json summarises them, rewritten
    after each N, so a run stopped part-way (a batch job's scancel) keeps the rows of the N that finished. A SIGTERM
    or SIGINT stops the N running (AIPerf writes the records of the requests that ended in c<N>/), names it and
    tallies its requests in goodput.json's `stopped`, and raises ProfileStopped."""
    out_dir = Path(out_dir)
    rows: list[GoodputRow] = []
    with stop_on_signal() as stop:
        for n in concurrencies:
            point = replace(load, concurrency=n)
            budget = point.warmup_s + point.window_s + point.grace_s
            say(f"N={n}: aiperf {AIPERF_VERSION} profile, {budget:g} s of load (+ AIPerf's own start-up)")
            try:
                if stop.reason:
                    raise ProfileStopped(stop.reason, out_dir / f"c{n}")
                summary = run_profile(tool, point, out_dir / f"c{n}", timeout_s=budget + 600, stop=stop)
            except ProfileStopped as exc:
                write_report(load, concurrencies, rows, out_dir, stopped={
                    "concurrency": n, "reason": exc.reason, "artifact_dir": str(exc.artifact_dir),
                    **stopped_tally(exc.artifact_dir)})
                raise
            rows.append(GoodputRow(n, summary, out_dir / f"c{n}", load.min_good_fraction))
            say(format_row(rows[-1]))
            write_report(load, concurrencies, rows, out_dir)
    return rows


def write_report(load: ClosedLoad, concurrencies: list[int], rows: list[GoodputRow], out_dir: Path,
                 stopped: dict | None = None) -> None:
    """out_dir/goodput.json: the rows so far, the scoring point among them, the N declared but not (yet) run, and
    the N a signal stopped (`stopped`: its N, the signal, where AIPerf left its records, how many completed, failed
    and were cut off in flight; null when none was)."""
    best = best_row(rows)
    done = {r.concurrency for r in rows}
    report = {"aiperf_version": AIPERF_VERSION, "url": load.url, "model": load.model,
              "input_tokens": load.input_tokens, "output_tokens": load.output_tokens, "warmup_s": load.warmup_s,
              "window_s": load.window_s, "grace_s": load.grace_s, "num_dataset_entries": load.num_dataset_entries,
              "slo": {"ttft_ms": load.ttft_ms, "itl_ms": load.itl_ms, "min_good_fraction": load.min_good_fraction},
              "rows": [r.as_json() for r in rows],
              "not_run": [n for n in concurrencies if n not in done],
              "best": None if best is None else {"concurrency": best.concurrency,
                                                 "good_output_tok_s": best.summary.good_output_tok_s},
              "largest_passing_concurrency": max((r.concurrency for r in rows if r.clears_gate), default=None),
              "stopped": stopped}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "goodput.json").write_text(json.dumps(report, indent=2) + "\n")


def format_row(row: GoodputRow) -> str:
    s = row.summary

    def q(d: dict[str, float]) -> str:
        return "/".join(f"{d.get(k, float('nan')):.0f}" for k in ("p50", "p90", "p99"))

    return (f"N={row.concurrency:<4} out {s.output_tok_s:9.1f} tok/s  good {s.good_output_tok_s:9.1f} tok/s  "
            f"good fraction {s.good_fraction:.3f}  TTFT p50/p90/p99 {q(s.ttft_ms)} ms  ITL {q(s.itl_ms)} ms  "
            f"{s.request_count} req, {s.error_count} err  {'PASS' if row.clears_gate else 'FAIL'} gate")


def verdict_line(rows: list[GoodputRow]) -> str:
    best = best_row(rows)
    if best is None:
        gate = rows[0].min_good_fraction if rows else MIN_GOOD_FRACTION
        return (f"goodput: no N clears the gate (good fraction >= {gate:.2f} under the SLA); "
                "lower the concurrency or change the layout")
    return (f"goodput: score {best.summary.good_output_tok_s:.1f} good output tok/s at N={best.concurrency} "
            f"(good fraction {best.summary.good_fraction:.3f}); largest N clearing the gate: "
            f"{max(r.concurrency for r in rows if r.clears_gate)}")
