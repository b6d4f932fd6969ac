"""Closed-loop back-test: measured AIPerf points (benchmarks/backtest/closed_loop.yaml) against `plan`'s prediction.

dataset rows (config, N, measured output tok/s, good fraction, TTFT/ITL p50) -> one simulated window per row
(predict.py's point at that N, the row's config) -> ClosedLoopCheck (errors = predicted / measured - 1, gate agreed?)
-> ClosedLoopBand for a model: the output tok/s MAPE and the rest, what `plan` prints in place of "no out-of-sample
rows yet" once a model has rows. Every row is out of sample; none has a bound (reported, not pinned).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from orchestrator.config import load_config
from orchestrator.plan.closedloop.client import ClosedLoopLoad, simulate_closed_loop
from orchestrator.plan.closedloop.predict import ClosedLoopPoint

ROOT = Path(__file__).resolve().parents[3]
DATASET = ROOT / "benchmarks" / "backtest" / "closed_loop.yaml"


@dataclass(frozen=True)
class ClosedLoopCheck:
    row_id: str
    model: str
    concurrency: int
    measured: dict[str, float]
    predicted: dict[str, float]
    min_good_fraction: float

    def error(self, key: str) -> float:
        return self.predicted[key] / self.measured[key] - 1 if self.measured[key] else float("nan")

    @property
    def gate_agrees(self) -> bool:
        gate = self.min_good_fraction
        return (self.predicted["good_fraction"] >= gate) == (self.measured["good_fraction"] >= gate)


@dataclass(frozen=True)
class ClosedLoopBand:
    model: str
    checks: tuple[ClosedLoopCheck, ...]

    def _mape(self, key: str) -> float:
        return sum(abs(c.error(key)) for c in self.checks) / len(self.checks)

    def text(self) -> str:
        worst = max((c.error("output_tok_s") for c in self.checks), key=abs)
        agreed = sum(c.gate_agrees for c in self.checks)
        return (f"closed-loop back-test of {self.model}: output tok/s ±{self._mape('output_tok_s'):.0%} (MAPE of "
                f"{len(self.checks)} measured points, out of sample; worst {worst:+.0%}), ITL p50 "
                f"±{self._mape('itl_p50_ms'):.0%}, TTFT p50 ±{self._mape('ttft_p50_ms'):.0%}, gate verdict agreed "
                f"at {agreed} of {len(self.checks)} (benchmarks/backtest/closed_loop.yaml)")


def _predict(config: str, overrides: tuple[str, ...], concurrency: int) -> tuple[str, dict[str, float], float]:
    cfg = load_config(ROOT / config, list(overrides))
    slo = cfg.benchmark.slo
    point = ClosedLoopPoint(concurrency, simulate_closed_loop(cfg, ClosedLoopLoad.of(cfg, concurrency)), slo)
    predicted = {"output_tok_s": point.output_tok_s, "good_fraction": point.good_fraction,
                 "ttft_p50_ms": point.run.ttft_ms()["p50"], "itl_p50_ms": point.run.itl_ms()["p50"]}
    return cfg.model.architecture().name, predicted, slo.min_good_fraction


def closed_loop_backtest(path: Path = DATASET) -> list[ClosedLoopCheck]:
    """Every row of the dataset predicted at its config and N (cached per file version)."""
    resolved = Path(path).resolve()
    return list(_backtest_cached(str(resolved), resolved.stat().st_mtime_ns))


@lru_cache(maxsize=2)
def _backtest_cached(path: str, _mtime: int) -> tuple[ClosedLoopCheck, ...]:
    rows = (yaml.safe_load(Path(path).read_text()) or {}).get("rows", [])
    out = []
    for row in rows:
        model, predicted, gate = _predict(row["config"], tuple(row.get("set", [])), int(row["concurrency"]))
        out.append(ClosedLoopCheck(row["id"], model, int(row["concurrency"]), dict(row["measured"]), predicted, gate))
    return tuple(out)


def closed_loop_band(model: str, path: Path = DATASET) -> ClosedLoopBand | None:
    """The closed-loop error of `model`'s rows; None when the dataset has none of it (or no dataset)."""
    if not Path(path).is_file():
        return None
    checks = tuple(c for c in closed_loop_backtest(path) if c.model == model)
    return ClosedLoopBand(model, checks) if checks else None
