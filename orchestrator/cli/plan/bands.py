"""The back-test's error band as `plan` and `compare` print it next to a prediction: the batch back-test's
out-of-sample full-run band for the config's model, the closed-loop back-test's where it has points, or why none."""

from __future__ import annotations

from orchestrator.config import RunConfig
from orchestrator.plan.backtest.band import ErrorBand, error_band, out_of_sample_models
from orchestrator.plan.backtest.dataset import BacktestError
from orchestrator.plan.simulation.runs import SimulationError


def error_band_of(cfg: RunConfig) -> ErrorBand | None:
    """The back-test's out-of-sample full-run band (calibration points' figure beside it), when it has full runs of
    this config's model (None otherwise)."""
    try:
        if cfg.model.architecture().name not in out_of_sample_models():
            return None
        return error_band()
    except (BacktestError, SimulationError, ValueError, OSError):
        return None


def no_band_text(cfg: RunConfig) -> str:
    name = cfg.model.architecture().name
    try:
        measured = out_of_sample_models()
    except (BacktestError, ValueError, OSError):
        return "none recorded"
    return "none recorded" if name in measured else f"no out-of-sample rows yet for {name}"


def closed_loop_band_text(cfg: RunConfig) -> str:
    """The closed-loop back-test's error for this model where it has measured points; else the batch back-test's
    band (`plan --backtest`; TTFT, ITL and goodput not back-tested) or "no out-of-sample rows yet"."""
    from orchestrator.plan.closedloop.backtest import closed_loop_band

    closed = closed_loop_band(cfg.model.architecture().name)
    if closed is not None:
        return closed.text()
    band = error_band_of(cfg)
    return ("batch throughput " + band.text() + " (`plan --backtest`; TTFT, ITL and goodput are not back-tested)"
            if band else no_band_text(cfg))
