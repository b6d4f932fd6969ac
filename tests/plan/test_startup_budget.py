"""plan/closedloop/startup_budget: one start-up budget for the serve+goodput job's walltime and every SGLang engine's
ready timeout; the one line an engine that runs out of it fails with."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config import load_config
from orchestrator.plan.closedloop.startup_budget import (
    PREPARE_OVER_PLAN,
    RAY_BRINGUP_S,
    SERVE_OVER_PLAN,
    TIMEOUT_FIELD,
    engine_ready_timeout,
    startup_budget,
)

ROOT = Path(__file__).resolve().parents[2]
QWEN3_PRESET = str(ROOT / "configs" / "qwen3-pd-2026.yaml")


def test_a_real_engines_ready_timeout_is_the_jobs_start_up_budget(capsys):
    """Unset engine.sglang.startup_timeout_s: each engine may take what the job's walltime gives the whole start-up,
    the same number jobscript writes as serve's PDO_READY_TIMEOUT_S, on any GPU."""
    for gpu in ("H100-SXM", "H200"):
        overrides = ["engine.kind=sglang", f"cluster.gpu={gpu}"]
        cfg = load_config(QWEN3_PRESET, overrides)
        assert cfg.engine.sglang.startup_timeout_s is None
        timeout = engine_ready_timeout(cfg)
        budget = startup_budget(cfg)
        assert timeout.seconds == budget.total_s == round(
            RAY_BRINGUP_S + budget.cold_plan_s * PREPARE_OVER_PLAN + budget.warm_plan_s * SERVE_OVER_PLAN)
        assert timeout.field == TIMEOUT_FIELD and f"start-up budget {budget.total_s:g} s" in timeout.source
        sets = [w for o in overrides for w in ("--set", o)]
        assert main(["jobscript", "--scheduler", "slurm", "--config", QWEN3_PRESET, "--then", "serve+goodput",
                     *sets]) == 0
        job = capsys.readouterr().out
        ready = re.search(r"PDO_READY_TIMEOUT_S=\$\{PDO_READY_TIMEOUT_S:-(\d+)\}", job)
        assert ready is not None and float(ready.group(1)) == timeout.seconds


def test_a_set_startup_timeout_wins_and_the_simulated_engine_keeps_the_deadline():
    cfg = load_config(QWEN3_PRESET, ["engine.kind=sglang", "engine.sglang.startup_timeout_s=1500"])
    timeout = engine_ready_timeout(cfg)
    assert (timeout.seconds, timeout.field) == (1500, TIMEOUT_FIELD) and "budget" not in timeout.source
    sim = load_config(QWEN3_PRESET, ["engine.kind=sim"])
    assert engine_ready_timeout(sim).seconds == sim.benchmark.deadline_s


def test_the_timeout_error_is_one_line_naming_the_budget_the_phase_and_the_field():
    cfg = load_config(QWEN3_PRESET, ["engine.kind=sglang"])
    timeout = engine_ready_timeout(cfg)
    line = timeout.error("decode-0/0", "capturing CUDA graphs", "/tmp/logs/decode-0-0.log")
    assert "\n" not in line
    assert line.startswith(f"decode-0/0: engine not ready after {timeout.seconds:.0f} s, the start-up budget ")
    assert "it was capturing CUDA graphs (log /tmp/logs/decode-0-0.log)" in line
    assert line.endswith(f"raise {TIMEOUT_FIELD} (--set {TIMEOUT_FIELD}=SECONDS)")


@pytest.mark.parametrize("bad", ["0", "-5"])
def test_a_non_positive_startup_timeout_is_refused_naming_the_field(bad):
    with pytest.raises(Exception, match="startup_timeout_s"):
        load_config(QWEN3_PRESET, ["engine.kind=sglang", f"engine.sglang.startup_timeout_s={bad}"])
