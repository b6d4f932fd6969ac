"""Deadline preflight: phases match the bench driver's, verdict thresholds, start-up inputs, projected finish."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.config.model_presets import DEEPSEEK_R1
from orchestrator.observe.metrics import BENCH_PHASES
from orchestrator.perfmodel.costmodel import GB, checkpoint_bytes, cost_model_for
from orchestrator.perfmodel.gpus import GPU_SPECS
from orchestrator.plan.deadline import (
    AT_RISK,
    INVALID,
    VALID,
    predict_deadline,
    projected_finish_s,
)
from orchestrator.plan.simulate import simulate_run, synthetic_batch

ROOT = Path(__file__).resolve().parents[2]
BATCH = synthetic_batch(200, seed=11)


def default(*overrides: str):
    return load_config(ROOT / "configs/default.yaml", list(overrides))


def test_budget_phases_are_the_bench_drivers_and_add_up() -> None:
    budget = predict_deadline(default(), BATCH)
    assert [p.name for p in budget.phases] == [p for p in BENCH_PHASES if p != "done"]
    assert budget.total_s == pytest.approx(sum(p.predicted_s for p in budget.phases))
    assert budget.phase_s("run") == pytest.approx(simulate_run(default(), BATCH, gpu="H100-SXM").duration_s)
    assert budget.verdict == VALID
    assert "simulated" in budget.table() and "-> VALID" in budget.table()


def test_verdict_is_valid_at_risk_or_invalid_against_the_deadline() -> None:
    total = predict_deadline(default(), BATCH).total_s
    assert predict_deadline(default(f"benchmark.deadline_s={total * 1.05}"), BATCH).verdict == AT_RISK
    assert predict_deadline(default(f"benchmark.deadline_s={total * 0.9}"), BATCH).verdict == INVALID
    assert predict_deadline(default(f"benchmark.deadline_s={total * 1.2}"), BATCH).verdict == VALID


def test_real_weights_from_disk_and_a_cold_jit_cache_lengthen_engine_start() -> None:
    dummy = predict_deadline(default(), BATCH).phase_s("engine_start")
    disk = predict_deadline(default("engine.sglang.load_format=null"), BATCH, disk_gb_s=4.0).phase_s("engine_start")
    assert disk - dummy == pytest.approx(checkpoint_bytes(DEEPSEEK_R1, "w4a8") / (4.0 * GB), rel=0.02)
    budget = predict_deadline(default(), BATCH, jit_cached=False)
    cold = budget.phase_s("engine_start")
    # cold caches: every decode graph batch size (52 at TP8) compiles its kernels, and the first forwards
    # JIT-compile; the figures are the H100 calibration profile's start-up (measured on one H100)
    cfg = default()
    model = cost_model_for(cfg, "decode", cfg.layout.decode[0])
    st = model.calibration.startup
    assert len(model.graph_batch_sizes()) == 52
    assert cold - dummy == pytest.approx(52 * st.graph_bs_cold_s + st.jit_cold_s)
    assert GPU_SPECS["H100-SXM"].jit_cold_s < 60  # not the "~10 minutes" DeepGEMM figure
    assert budget.engine_start_warm_s == pytest.approx(dummy) and budget.engine_start_cold_s == pytest.approx(cold)


def test_a_sim_engine_uses_its_configured_startup_and_time_scale() -> None:
    cfg = default("engine.sim.startup_s=10", "engine.sim.time_scale=0.5")
    budget = predict_deadline(cfg, BATCH)
    assert budget.phase_s("engine_start") == pytest.approx(5.0)
    assert budget.phase_s("run") == pytest.approx(0.5 * budget.run.duration_s)


def test_no_warmup_policy_means_no_warmup_phase_time() -> None:
    assert predict_deadline(default("benchmark.warmup.policy=none"), BATCH).phase_s("warmup") == 0.0
    assert predict_deadline(default("benchmark.warmup.policy=sglang"), BATCH).phase_s("warmup") > 0.0


def test_projected_finish_follows_the_prediction_then_the_measured_rate() -> None:
    budget = predict_deadline(default(), BATCH)
    assert projected_finish_s(budget, 0.0, "placement", 0.0) == pytest.approx(budget.total_s)
    # engine start overran its prediction by 30 s: everything later shifts by 30 s
    start = budget.phase_s("placement")
    late = start + budget.phase_s("engine_start") + 30
    assert projected_finish_s(budget, late, "engine_start", start) == pytest.approx(budget.total_s + 30)
    # half the tokens done in a quarter of the predicted run time: finish earlier than predicted
    run_start = budget.total_s - budget.phase_s("run") - budget.phase_s("report")
    quarter = run_start + budget.phase_s("run") / 4
    assert projected_finish_s(budget, quarter, "run", run_start, 500, 1000) < budget.total_s
    assert projected_finish_s(budget, 123.0, "done", 0.0) == 123.0
    # the bench driver's labels work too
    assert projected_finish_s(budget, late, "engine start", start) == pytest.approx(budget.total_s + 30)
    assert projected_finish_s(budget, 2.0, "dataset", 1.0) == pytest.approx(2.0 + budget.total_s)
    with pytest.raises(ValueError, match="unknown phase 'loading'"):
        projected_finish_s(budget, 1.0, "loading", 0.0)
