"""The error band `plan` prints next to each prediction: the out-of-sample full-run throughput error (ErrorBand), whole
and split by the share of decode steps each row's own prediction runs eager (ClassBand), and the models it was measured
on; both cached on disk for the same inputs (plan/backtest_cache.py)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from orchestrator.config import load_config
from orchestrator.plan.backtest.dataset import DATASET, ROOT, load_dataset
from orchestrator.plan.backtest.predict import predict_row
from orchestrator.plan.backtest.rows import throughput_scope
from orchestrator.plan.backtest_cache import cached

# The band's two classes, by a property known before launch: the share of its decode steps the planner's own run of a
# prediction runs eager (a decoding server running more requests than its largest CUDA graph). Fixed a priori
# (2026-11-27, before any row's class was computed): more than 1 % of the decode steps. Why: the error the classes
# separate is the eager step's machine mode (docs/fidelity.md, hattr's phase attribution and hgpu7's bimodal step: an
# eager step runs x1.0-2.0 the model's), which acts on every eager step in proportion to the time spent there; eager
# steps are the run's largest batches, so even 1 % of the steps at x2.0 moves a run by a few percent, while a few
# steps at a peak just above the graph (under 1 %) are a blip, not a stretch. Never tuned to the rows' errors.
EAGER_STRETCH_SHARE = 0.01


EAGER, GRAPHED = "eager", "graphed"
CLASS_TEXT = {EAGER: "with eager decode stretches", GRAPHED: "without eager decode stretches"}


def eager_class(eager_share: float) -> str:
    """The band class of a prediction whose own run runs `eager_share` of its decode steps eager."""
    return EAGER if eager_share > EAGER_STRETCH_SHARE else GRAPHED


@dataclass(frozen=True)
class ClassBand:
    """The out-of-sample full-run error of one class (eager | graphed), classed by each row's prediction."""

    name: str
    mape: float
    worst: float
    rows: int

    def text(self) -> str:
        return (f"±{self.mape:.0%} over {self.rows} out-of-sample run{'s' if self.rows != 1 else ''} "
                f"{CLASS_TEXT[self.name]} (worst {self.worst:+.0%})")


@dataclass(frozen=True)
class ErrorBand:
    """The planner's throughput error on the full runs no profile was fitted on: what a `plan` prediction is
    worth, whole and per class (by the share of decode steps each row's own prediction runs eager); with the
    out-of-sample single-server calibration points' error beside it (not part of the band)."""

    mape: float
    worst: float  # the largest signed error, by size
    rows: int
    points_mape: float | None = None
    points_worst: float | None = None
    points: int = 0
    classes: tuple[ClassBand, ...] = ()

    def of_class(self, name: str) -> ClassBand | None:
        return next((c for c in self.classes if c.name == name), None)

    def class_mape(self, eager_share: float) -> float:
        """The band a prediction of this eager share is worth: its class's MAPE, else the whole set's."""
        band = self.of_class(eager_class(eager_share))
        return band.mape if band else self.mape

    def text(self, eager_share: float | None = None) -> str:
        """The whole set's band, or (given a prediction's eager share) its class's band first and the whole set's
        beside it; the calibration points' figure after both."""
        text = (f"±{self.mape:.0%} on out-of-sample runs (MAPE of {self.rows} full runs never fitted on; "
                f"worst {self.worst:+.0%})")
        if eager_share is not None:
            name = eager_class(eager_share)
            band = self.of_class(name)
            head = band.text() if band else f"no out-of-sample run {CLASS_TEXT[name]} yet"
            text = (f"{head}: this prediction's class, {eager_share:.0%} of its decode steps eager (class line "
                    f"{EAGER_STRETCH_SHARE:.0%}); all {self.rows} out-of-sample runs ±{self.mape:.0%} (worst "
                    f"{self.worst:+.0%})")
        if self.points:
            text += (f"; single-server calibration points: ±{self.points_mape:.0%} over {self.points} "
                     f"(worst {self.points_worst:+.0%}; the harness client's wall, not a full run)")
        return text


def rows_text(band: ErrorBand, shares: dict[str, float]) -> str:
    """The band of several predictions at once (`compare`): each class's figure with the rows in it, then the whole
    set's and the points' (band.text())."""
    parts = []
    for name in (EAGER, GRAPHED):
        names = [row for row, share in shares.items() if eager_class(share) == name]
        if names:
            of_class = band.of_class(name)
            head = of_class.text() if of_class else f"no out-of-sample run {CLASS_TEXT[name]} yet"
            parts.append(f"{head}: {', '.join(names)}")
    return "; ".join(parts) + ("; all: " if parts else "") + band.text()


def class_bands(rows: list[tuple[float, float]]) -> tuple[ClassBand, ...]:
    """(error, eager share of the row's prediction) per out-of-sample full run -> the band of each class it has."""
    out = []
    for name in (EAGER, GRAPHED):
        errors = [e for e, share in rows if eager_class(share) == name]
        if errors:
            out.append(ClassBand(name, statistics.mean(abs(e) for e in errors), max(errors, key=abs), len(errors)))
    return tuple(out)


def error_band(path: str | Path = DATASET) -> ErrorBand | None:
    """The out-of-sample full-run throughput error band (whole, per eager class, plus the calibration points'
    figure), from the back-test as the model predicts it now (only the out-of-sample throughput rows are simulated);
    None when the dataset has no out-of-sample full run. Cached per dataset file in the process, and on disk for the
    same inputs (backtest_cache.py: the code, profiles, configs and files the rows name), since `plan` prints it
    every time."""
    resolved = Path(path).resolve()
    return _error_band_cached(str(resolved), resolved.stat().st_mtime_ns)


def _decode_band(value: dict | None) -> ErrorBand | None:
    if value is None:
        return None
    return ErrorBand(**{**value, "classes": tuple(ClassBand(**c) for c in value["classes"])})


@lru_cache(maxsize=4)
def _error_band_cached(path: str, _mtime: int) -> ErrorBand | None:
    return cached("error-band", Path(path), lambda: _compute_error_band(path),
                  encode=lambda band: None if band is None else asdict(band), decode=_decode_band)


def _compute_error_band(path: str) -> ErrorBand | None:
    data = load_dataset(path)
    base = Path(path).parent
    rows = [predict_row(row, data["batches"], base) for row in data["runs"]
            if row.get("sample") == "out" and row.get("kind") == "throughput"]
    runs = [r for r in rows if r.error is not None and r.scope == "run"]
    errors = [r.error for r in runs if r.error is not None]
    points = [r.error for r in rows if r.error is not None and r.scope == "point"]
    if not errors:
        return None
    return ErrorBand(mape=statistics.mean(abs(e) for e in errors), worst=max(errors, key=abs), rows=len(errors),
                     points_mape=statistics.mean(abs(e) for e in points) if points else None,
                     points_worst=max(points, key=abs) if points else None, points=len(points),
                     classes=class_bands([(r.error, r.eager_share or 0.0) for r in runs if r.error is not None]))


def out_of_sample_models(path: str | Path = DATASET) -> set[str]:
    """Architecture names the out-of-sample full-run throughput rows were measured on (the band comes from them
    and says nothing about another model). Cached on disk as `error_band` is."""
    resolved = Path(path).resolve()
    return set(cached("out-of-sample-models", resolved, lambda: sorted(_compute_out_of_sample_models(resolved)),
                      encode=lambda names: names, decode=lambda value: [str(name) for name in value]))


def _compute_out_of_sample_models(path: Path) -> set[str]:
    data = load_dataset(path)
    return {load_config(ROOT / row["config"], paths_from=ROOT).model.architecture().name for row in data["runs"]
            if row.get("sample") == "out" and row.get("kind") == "throughput" and throughput_scope(row) == "run"}
