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
            RAY_BRINGUP_S + budget.prepare_plan_s * PREPARE_OVER_PLAN + budget.warm_plan_s * SERVE_OVER_PLAN)
        assert timeout.field == TIMEOUT_FIELD and f"start-up budget {budget.total_s:g} s" in timeout.source
        sets = [w for o in overrides for w in ("--set", o)]
        assert main(["jobscript", "--scheduler", "slurm", "--config", QWEN3_PRESET, "--then", "serve+goodput",
                     *sets]) == 0
        job = capsys.readouterr().out
        ready = re.search(r"PDO_READY_TIMEOUT_S=\$\{PDO_READY_TIMEOUT_S:-(\d+)\}", job)
        assert ready is not None and float(ready.group(1)) == timeout.seconds


def test_a_layout_plan_cannot_price_still_gets_a_ready_timeout_the_run_s_deadline_naming_why():
    """`bench --force` runs a layout the planner says does not fit; every worker replica computes its ready timeout in
    its constructor, so a budget that raised there would fail every replica before its engine started."""
    from orchestrator.plan.simulation.runs import SimulationError

    cfg = load_config(str(ROOT / "configs" / "h100-2p1d-tp4.yaml"))  # R1's weights leave TP 4 on H100 no KV cache
    assert not cfg.simulated and cfg.engine.sglang.startup_timeout_s is None
    with pytest.raises(SimulationError):
        startup_budget(cfg)
    timeout = engine_ready_timeout(cfg)
    assert timeout.seconds == cfg.benchmark.deadline_s and timeout.field == TIMEOUT_FIELD
    assert timeout.source.startswith(f"benchmark.deadline_s {cfg.benchmark.deadline_s:g} s (no start-up budget: ")
    assert "leave no KV cache" in timeout.source


def test_prepares_part_adds_its_warm_up_through_the_step_model_and_its_stop_to_plans_cold_time_to_ready():
    """After its engines are ready prepare sends the warm-up (each prefill's first forward alone, then the short
    prompts) and stops the servers and the local cluster: the warm-up as bench's deadline prices it with cold caches,
    the stop as bench's report phase; serve's part stays plan's warm time to ready."""
    from orchestrator.plan.closedloop.predict import predict_ready
    from orchestrator.plan.deadline import REPORT_S, warmup_batch_shapes, first_forwards_s
    from orchestrator.plan.simulation.runs import batch_shapes
    from orchestrator.plan.simulation.simulate import simulate_run

    cfg = load_config(QWEN3_PRESET, ["engine.kind=sglang", "cluster.gpu=H200"])
    budget = startup_budget(cfg)
    warm_up = warmup_batch_shapes(cfg, batch_shapes(cfg, synthetic=True)[0])
    assert len(warm_up) == cfg.benchmark.warmup.num_prompts and all(o <= 16 for _, o in warm_up)
    assert budget.prepare_warmup_s == pytest.approx(
        first_forwards_s(cfg, "H200").cold_s + simulate_run(cfg, warm_up, gpu="H200").duration_s)
    assert 0 < budget.prepare_warmup_s < 5 and budget.prepare_stop_s == REPORT_S["sglang"]
    assert budget.prepare_plan_s == pytest.approx(predict_ready(cfg, "H200", jit_cached=False).ready_s
                                                  + budget.prepare_warmup_s + budget.prepare_stop_s)
    assert budget.warm_plan_s == predict_ready(cfg, "H200", jit_cached=True).ready_s
    # no warm-up: nothing sent, the stop stays
    none = startup_budget(load_config(ROOT / "configs" / "default.yaml",
                                      ["engine.kind=sglang", "benchmark.warmup.policy=none"]))
    assert (none.prepare_warmup_s, none.prepare_stop_s) == (0.0, REPORT_S["sglang"])
    assert f"warm-up {budget.prepare_warmup_s:.1f} s + stop 22 s" in budget.parts()


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
