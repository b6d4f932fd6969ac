"""The back-test as a user reads it: one table line per row, the MAPE of each sample and class apart, and the summary
(rows inside their bounds, reported misses, regressions, rows marked miss but inside now)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from orchestrator.plan.backtest.band import CLASS_TEXT, EAGER_STRETCH_SHARE, class_bands, eager_class
from orchestrator.plan.backtest.rows import BacktestRow
from orchestrator.tables import table


def _fmt(value: float | str, unit: str) -> str:
    if isinstance(value, str):
        return value
    if unit.startswith("s"):
        return f"{value:.0f} s"
    if unit == "ratio":
        return f"{value:.2f}"
    return f"{value:,.0f}"


def backtest_table(rows: Sequence[BacktestRow], markdown: bool = False) -> str:
    """One line per row: id, in/out of sample, what it measures (run | point), source, measured, predicted, error,
    bound and when it was set, verdict."""
    head = ["row", "sample", "measures", "source", "measured", "predicted", "error", "bound", "bound set", "ok", "detail"]
    lines = []
    for r in rows:
        bound = f"±{r.bound:.0%}" if r.bound is not None else ("same" if r.kind in ("memory", "direction") else "-")
        ok = {True: "yes", False: "MISS", None: "-"}[r.within]
        if r.within is False and r.expect == "miss":
            ok = "MISS (reported)"
        lines.append([r.id, r.sample, r.scope or r.kind, r.source, _fmt(r.measured, r.unit), _fmt(r.predicted, r.unit), r.error_text(),
                      bound, r.bound_set.split(" (")[0], ok, r.detail + _eager_text(r)])
    return table(head, lines, markdown)


def _eager_text(r: BacktestRow) -> str:
    """A full run's band class, from its own prediction (what `plan` would have said before launch)."""
    if r.scope != "run" or r.eager_share is None:
        return ""
    return f"; predicted eager {r.eager_share:.0%} of decode steps ({eager_class(r.eager_share)})"


SAMPLE_NAMES = {"in": "in-sample (a shipped profile was fitted on the run)", "out": "out-of-sample (never fitted on)"}


def mape(rows: Sequence[BacktestRow], sample: str, kind: str = "throughput",
         scope: str | None = None) -> tuple[float | None, int]:
    """Mean absolute percentage error of the rows of one sample ('in' | 'out') and kind (and, for throughput,
    scope: 'run' | 'point' | None for both), and how many there are."""
    errors = [abs(r.error) for r in rows if r.sample == sample and r.kind == kind and r.error is not None
              and scope in (None, r.scope)]
    return (statistics.mean(errors) if errors else None), len(errors)


def _mape_text(rows: Sequence[BacktestRow], sample: str) -> str:
    parts = []
    for kind, scope, label in (("throughput", "run", "throughput of full runs"),
                               ("throughput", "point", "throughput of single-server calibration points"),
                               ("startup", None, "start-up"), ("ratio", None, "ratios")):
        value, n = mape(rows, sample, kind, scope)
        if n:
            parts.append(f"{label} {value:.1%} over {n} row{'s' if n > 1 else ''}"
                         + (_classes_text(rows, sample) if scope == "run" else ""))
    knobs = [r for r in rows if r.sample == sample and r.kind in ("direction", "memory")]
    if knobs:
        parts.append(f"directions/outcomes {sum(1 for r in knobs if r.within)} of {len(knobs)} right")
    return f"MAPE {SAMPLE_NAMES[sample]}: " + ("; ".join(parts) if parts else "no rows")


def _classes_text(rows: Sequence[BacktestRow], sample: str) -> str:
    """The full runs' MAPE per eager class (band.py), each row classed by its own prediction's eager share."""
    runs = [r for r in rows if r.sample == sample and r.kind == "throughput" and r.scope == "run"
            and r.error is not None]
    bands = class_bands([(r.error, r.eager_share or 0.0) for r in runs if r.error is not None])
    return " (" + "; ".join(f"{CLASS_TEXT[b.name]} {b.mape:.1%} over {b.rows}" for b in bands) + ")" if bands else ""


def summary(rows: Sequence[BacktestRow]) -> str:
    """How many rows are inside their bounds, which are not (reported misses and regressions), and the MAPE
    of the in-sample and the out-of-sample rows, each on its own line."""
    pinned = [r for r in rows if r.within is not None]
    missed = [r for r in pinned if not r.within]
    text = f"back-test: {len(pinned) - len(missed)} of {len(pinned)} rows inside the bounds set before they were predicted"
    reported = [r for r in missed if not r.regressed]
    regressed = [r for r in missed if r.regressed]
    if reported:
        text += "; reported misses: " + ", ".join(f"{r.id} ({r.error_text()})" for r in reported)
    if regressed:
        text += "; REGRESSED (inside when first predicted): " + ", ".join(
            f"{r.id} ({r.error_text()}{f'; inside since {r.inside_since}' if r.inside_since else ''})" for r in regressed)
    stale = [r for r in pinned if r.within and r.expect == "miss"]
    if unexplained := [r for r in stale if not r.inside_now]:
        text += "; marked expect: miss but inside now: " + ", ".join(f"{r.id} ({r.error_text()})" for r in unexplained)
    if kept := [r for r in stale if r.inside_now]:
        text += "; kept expect: miss although inside: " + ", ".join(f"{r.id} ({r.error_text()}: {r.inside_now})" for r in kept)
    if missed:
        text += " (docs/fidelity.md says why)"
    return "\n".join([text, _mape_text(rows, "in"), _mape_text(rows, "out"), CLASSES_NOTE, POINTS_NOTE])


CLASSES_NOTE = (f"(eager decode stretches: the row's own prediction runs more than {EAGER_STRETCH_SHARE:.0%} of its "
                "decode steps past its largest CUDA graph, a class known before launch; docs/planning.md)")
POINTS_NOTE = ("(full runs: a batch through the servers, what `plan` predicts; calibration points: one lone server's "
               "decode/context/prefill point, tokens over the harness client's wall, which includes stalls the planner "
               "does not claim to predict, e.g. likely first-use kernel compilation in eager mode)")
