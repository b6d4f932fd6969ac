"""benchmarks/embedded_vs_plan.py: plan's prediction as `plan` prints it, and the machine it records."""

from __future__ import annotations

from benchmarks import embedded_vs_plan
from orchestrator.config import load_config
from orchestrator.plan.deadline import predict_deadline
from orchestrator.plan.simulation.simulate import batch_shapes


def test_plan_prediction_is_plans_run_phase_on_plans_batch():
    got = embedded_vs_plan.plan_prediction("configs/default.yaml", ["benchmark.num_prompts=40"])
    cfg = load_config("configs/default.yaml", ["benchmark.num_prompts=40"])
    batch, source = batch_shapes(cfg)
    budget = predict_deadline(cfg, batch, gpu=cfg.cluster.gpu)
    assert got["prompts"] == 40 and got["batch_source"] == source
    assert got["run_s"] == budget.run.duration_s == budget.phase_s("run")
    assert abs(got["output_throughput"] * got["run_s"] - sum(o for _, o in batch)) < 1e-6 * sum(o for _, o in batch)


def test_load_sampler_records_the_load_while_it_runs():
    with embedded_vs_plan.LoadSampler(period_s=0.01) as load:
        embedded_vs_plan.uptime()
    assert load.samples and "mean" in load.summary()
    assert "load average" in embedded_vs_plan.uptime()
