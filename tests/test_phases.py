"""Phase: one spelling of the bench job's phases for the driver's log, the metrics and the deadline budget."""

import pytest

from orchestrator.observe.metrics import BENCH_PHASES, EXTRA_PHASES
from orchestrator.phases import Phase


def test_driver_titles_and_metric_labels_name_the_same_phase():
    assert [Phase.of(t) for t in ("engine start", "warm-up", "measured run")] == [
        Phase.ENGINE_START, Phase.WARMUP, Phase.RUN]
    assert all(Phase.of(p.value) is p and Phase.of(p.label) is p for p in Phase)


def test_metrics_phases_are_the_enum_in_order():
    assert (*EXTRA_PHASES, *BENCH_PHASES) == tuple(p.value for p in Phase)


def test_an_unknown_phase_names_every_spelling():
    with pytest.raises(ValueError, match="unknown bench phase 'warmup run'.*'measured run'.*'warmup'"):
        Phase.of("warmup run")
