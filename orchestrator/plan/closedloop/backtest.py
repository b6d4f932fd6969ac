"""Closed-loop back-test: measured AIPerf points (benchmarks/backtest/closed_loop.yaml) against `plan`'s prediction.

dataset rows (config, N, measured output tok/s, good fraction, TTFT/ITL p50, start-up; or `measured: null` for a run
not yet measured) -> one simulated window per row (predict.py's point at that N, the row's config) -> ClosedLoopCheck
(errors = predicted / measured - 1, gate agreed?, inside the row's bound?; for a pre-registered row also the error of
the prediction recorded before the run, read from its committed file) -> ClosedLoopBand for a model: the output tok/s
MAPE and the rest over the measured rows, what `plan` prints in place of "no out-of-sample rows yet".

Every row is out of sample. A bound (per metric, a fraction) is set before the row's run is measured and never widened;
`bound: null` = reported, not pinned (no bound was set before the row was first predicted).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from orchestrator.config import load_config
from orchestrator.plan.backtest.dataset import BacktestError
from orchestrator.plan.backtest.rows import missed_since
from orchestrator.plan.backtest_cache import cached, closed_loop_named_files
from orchestrator.plan.closedloop.client import ClosedLoopLoad, simulate_closed_loop
from orchestrator.plan.closedloop.predict import ClosedLoopPoint, predict_ready
from orchestrator.tables import table

ROOT = Path(__file__).resolve().parents[3]
DATASET = ROOT / "benchmarks" / "backtest" / "closed_loop.yaml"
METRICS = ("output_tok_s", "good_fraction", "ttft_p50_ms", "itl_p50_ms", "ready_s", "ready_cold_s")
LABELS = {"output_tok_s": "out tok/s", "ttft_p50_ms": "TTFT p50 ms", "itl_p50_ms": "ITL p50 ms",
          "ready_s": "ready s", "ready_cold_s": "ready cold s"}


@dataclass(frozen=True)
class RecordedPrediction:
    """A prediction committed before its run was measured: the `plan --json` file and the commit that wrote it."""

    path: str
    commit: str
    values: dict[str, float]


@dataclass(frozen=True)
class ClosedLoopCheck:
    row_id: str
    model: str
    concurrency: int
    measured: dict[str, float] | None  # None: the run is not measured yet (a pre-registered prediction)
    predicted: dict[str, float]
    min_good_fraction: float
    bound: dict[str, float] | None = None
    bound_set: str | None = None
    recorded: tuple[RecordedPrediction, ...] = ()  # predictions committed before the run, oldest (the bound's) first
    expect_miss: tuple[str, ...] = field(default=())

    @property
    def pending(self) -> bool:
        return self.measured is None

    def error(self, key: str, predicted: dict[str, float] | None = None) -> float:
        values = self.predicted if predicted is None else predicted
        if self.measured is None or key not in self.measured or key not in values or not self.measured[key]:
            return float("nan")
        return values[key] / self.measured[key] - 1

    def recorded_error(self, key: str, which: int = 0) -> float:
        return self.error(key, self.recorded[which].values) if len(self.recorded) > which else float("nan")

    def inside(self, key: str, predicted: dict[str, float] | None = None) -> bool | None:
        """Within the row's bound for `key` (None: no bound on it, or not measured)."""
        err = self.error(key, predicted)
        if not self.bound or key not in self.bound or math.isnan(err):
            return None
        return abs(err) <= self.bound[key] + 1e-12

    @property
    def gate_agrees(self) -> bool:
        if self.measured is None:
            return True
        gate = self.min_good_fraction
        return (self.predicted["good_fraction"] >= gate) == (self.measured["good_fraction"] >= gate)


@dataclass(frozen=True)
class ClosedLoopBand:
    model: str
    checks: tuple[ClosedLoopCheck, ...]  # measured rows only

    def _mape(self, key: str) -> float:
        errors = [abs(c.error(key)) for c in self.checks if not math.isnan(c.error(key))]
        return sum(errors) / len(errors) if errors else float("nan")

    def text(self) -> str:
        worst = max((c.error("output_tok_s") for c in self.checks), key=abs)
        agreed = sum(c.gate_agrees for c in self.checks)
        return (f"closed-loop back-test of {self.model}: output tok/s ±{self._mape('output_tok_s'):.0%} (MAPE of "
                f"{len(self.checks)} measured points, out of sample; worst {worst:+.0%}), ITL p50 "
                f"±{self._mape('itl_p50_ms'):.0%}, TTFT p50 ±{self._mape('ttft_p50_ms'):.0%}, gate verdict agreed "
                f"at {agreed} of {len(self.checks)} (benchmarks/backtest/closed_loop.yaml)")


def _predict(config: str, overrides: tuple[str, ...], concurrency: int, startup: bool
             ) -> tuple[str, dict[str, float], float]:
    cfg = load_config(ROOT / config, list(overrides), paths_from=ROOT)  # repository configs: paths from its root
    slo = cfg.benchmark.slo
    point = ClosedLoopPoint(concurrency, simulate_closed_loop(cfg, ClosedLoopLoad.of(cfg, concurrency)), slo)
    ready = predict_ready(cfg, cfg.cluster.gpu).as_json() if startup else None
    return cfg.model.architecture().name, metric_values(point.as_json(), ready), slo.min_good_fraction


def metric_values(row: dict, ready: dict | None) -> dict[str, float]:
    """The back-test's metric keys from one `plan --json` row (`ClosedLoopPoint.as_json`) and its `time_to_ready`
    (`ReadyEstimate.as_json`; None: not predicted): the one map for predictions made now and recorded ones."""
    values = {"output_tok_s": row["output_tok_s"], "good_fraction": row["good_fraction"],
              "ttft_p50_ms": row["ttft_ms"]["p50"], "itl_p50_ms": row["itl_ms"]["p50"]}
    if ready:
        values["ready_s"] = ready["placement_s"] + ready["engine_start_warm_s"] + ready["pair_warmup_s"]
        # `prepare`'s "ready after" starts after its node checks started the local cluster: no cluster start in it
        values["ready_cold_s"] = (ready["placement_s"] - ready.get("cluster_start_s", 0.0) + ready["engine_start_cold_s"]
                                  + ready["pair_warmup_s"])
    return values


def _recorded(specs: dict | list | None, concurrency: int) -> tuple[RecordedPrediction, ...]:
    """The committed `plan --json` rows of each pre-registered prediction, at this row's N."""
    return tuple(_one_recorded(s, concurrency) for s in ([specs] if isinstance(specs, dict) else specs or []))


def _one_recorded(spec: dict, concurrency: int) -> RecordedPrediction:
    document = json.loads((ROOT / spec["path"]).read_text())
    row = next(r for r in document["rows"] if r["concurrency"] == concurrency)
    return RecordedPrediction(spec["path"], spec["commit"], metric_values(row, document.get("time_to_ready")))


def closed_loop_backtest(path: Path = DATASET) -> list[ClosedLoopCheck]:
    """Every row of the dataset predicted at its config and N (cached per file version in the process, and on disk for
    the same inputs: plan/backtest_cache.py, since `plan` prints the band on every closed-loop run)."""
    resolved = Path(path).resolve()
    return list(_backtest_cached(str(resolved), resolved.stat().st_mtime_ns))


@lru_cache(maxsize=2)
def _backtest_cached(path: str, _mtime: int) -> tuple[ClosedLoopCheck, ...]:
    return cached("closed-loop-checks", Path(path), lambda: _compute_backtest(path),
                  encode=lambda checks: [asdict(c) for c in checks], decode=_decode_checks,
                  names=closed_loop_named_files)


def _decode_checks(value: list[dict]) -> tuple[ClosedLoopCheck, ...]:
    return tuple(ClosedLoopCheck(**{**c, "recorded": tuple(RecordedPrediction(**r) for r in c["recorded"]),
                                    "expect_miss": tuple(c["expect_miss"])}) for c in value)


def _compute_backtest(path: str) -> tuple[ClosedLoopCheck, ...]:
    rows = (yaml.safe_load(Path(path).read_text()) or {}).get("rows", [])
    out = []
    for row in rows:
        measured = row.get("measured")
        startup = measured is None or any(k in measured for k in ("ready_s", "ready_cold_s"))
        _check_missed_since(row)
        n = int(row["concurrency"])
        model, predicted, gate = _predict(row["config"], tuple(row.get("set", [])), n, startup)
        out.append(ClosedLoopCheck(
            row["id"], model, n, None if measured is None else dict(measured), predicted, gate,
            bound=row.get("bound"), bound_set=row.get("bound_set"), recorded=_recorded(row.get("recorded"), n),
            expect_miss=tuple(row.get("expect_miss") or ())))
    return tuple(out)


def _check_missed_since(row: dict) -> None:
    """Each metric of expect_miss says what put it outside its bound (backtest.missed_since); no other metric does."""
    named, since = tuple(row.get("expect_miss") or ()), row.get("missed_since") or {}
    if not isinstance(since, dict) or set(since) - set(named):
        raise BacktestError(f"row {row.get('id')!r}: missed_since maps each metric of expect_miss {list(named)} to a "
                            f"commit or first-prediction; got {since!r}")
    for metric in named:
        missed_since(row.get("id"), since.get(metric), True, f"missed_since.{metric}")


def closed_loop_band(model: str, path: Path = DATASET) -> ClosedLoopBand | None:
    """The closed-loop error of `model`'s measured rows; None when the dataset has none of it (or no dataset)."""
    if not Path(path).is_file():
        return None
    checks = tuple(c for c in closed_loop_backtest(path) if c.model == model and not c.pending)
    return ClosedLoopBand(model, checks) if checks else None


def _cell(check: ClosedLoopCheck, key: str) -> str:
    value = check.predicted.get(key)
    if value is None:
        return ""
    digits = 2 if key == "itl_p50_ms" else 0
    text = f"{value:,.{digits}f}"
    if check.measured is None or key not in check.measured:
        return text
    inside = check.inside(key)
    mark = "" if inside is None else (" ok" if inside else " MISS")
    return f"{text} / {check.measured[key]:,.{digits}f} ({check.error(key):+.0%}{mark})"


def closed_loop_table(checks: list[ClosedLoopCheck], markdown: bool = False) -> str:
    """One line per row: predicted (now) / measured (error, inside the bound?) per metric; the bound and when it was
    set; for a pre-registered row the error of the prediction recorded before the run."""
    keys = ("output_tok_s", "ttft_p50_ms", "itl_p50_ms", "ready_s")
    head = ["row", "N", *(f"{LABELS[k]} predicted / measured" for k in keys), "bound (set)", "recorded before the run"]
    lines = []
    for c in checks:
        bound = ("none (reported)" if not c.bound else
                 ", ".join(f"{LABELS.get(k, k)} ±{v:.0%}" for k, v in c.bound.items()) + f" ({c.bound_set})")
        recorded = "; ".join(
            f"{r.commit}: not measured yet" if c.pending else f"{r.commit}: " + ", ".join(
                f"{LABELS[k]} {c.recorded_error(k, i):+.0%}" for k in keys if not math.isnan(c.recorded_error(k, i)))
            for i, r in enumerate(c.recorded))
        cells = [c.row_id, str(c.concurrency), *(_cell(c, k) or "-" for k in keys), bound, recorded]
        cells[2:6] = [x + (" (pending)" if c.pending and x != "-" else "") for x in cells[2:6]]
        lines.append(cells)
    out = [table(head, lines, markdown)]
    measured = [c for c in checks if not c.pending]
    bounded = [(c, k) for c in measured for k in (c.bound or {}) if c.inside(k) is not None]
    misses = [f"{c.row_id} {LABELS.get(k, k)} ({c.error(k):+.0%})" for c, k in bounded if not c.inside(k)]
    if markdown:
        out.append("")  # a paragraph, not one more table row
    out.append(f"closed-loop back-test: {len(measured)} measured rows, {len(checks) - len(measured)} pending; "
               f"{len(bounded) - len(misses)} of {len(bounded)} bounded metrics inside the bound set before the run"
               + (f"; misses: {', '.join(misses)}" if misses else ""))
    return "\n".join(out)
