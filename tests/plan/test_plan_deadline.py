"""Deadline preflight: phases match the bench driver's, verdict thresholds, start-up inputs, projected finish."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.config.model_presets import DEEPSEEK_R1
from orchestrator.observe.metrics import BENCH_PHASES
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.gpus import GB
from orchestrator.perfmodel.weights import checkpoint_bytes
from orchestrator.perfmodel.gpus import GPU_SPECS
from orchestrator.plan.deadline import (
    AT_RISK,
    INVALID,
    VALID,
    first_forwards_s,
    predict_deadline,
    projected_finish_s,
)
from orchestrator.plan.simulation.simulate import simulate_run, synthetic_batch

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
    # cold caches: the first decode graph batch size compiles the kernels the other 51 (52 at TP8) reuse, each
    # of those adds a little, and the first forwards JIT-compile; the figures are the H100 calibration profile's
    # start-up (measured on one H100)
    cfg = default()
    model = cost_model_for(cfg, "decode", cfg.layout.decode[0])
    st = model.calibration.startup
    assert len(model.graph_batch_sizes()) == 52
    assert cold - dummy == pytest.approx(st.graph_once_cold_s + 51 * st.graph_bs_cold_s + st.jit_cold_s)
    assert st.graph_once_cold_s > 40 * st.graph_bs_cold_s
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


def test_the_dataset_warm_up_prices_each_servers_first_forward_alone_and_its_dp_ranks_one_after_another() -> None:
    # bench sends each prefilling server one full-chunk prompt per DP rank, each answered before the next, before
    # the short prompts (run/bench_warmup.py): none of it overlaps the short batch
    from orchestrator.workload.batch import bench_first_forwards

    def alone(cfg, prompt_len: int) -> float:
        return simulate_run(cfg, [(prompt_len, cfg.benchmark.warmup.max_output_len)], max_concurrency=None).duration_s

    cfg = default("benchmark.warmup.policy=dataset")
    (first,) = bench_first_forwards(cfg)
    assert first_forwards_s(cfg).warm_s == pytest.approx(alone(cfg, first.prompt_len))
    budget = predict_deadline(cfg, BATCH)
    assert budget.phase_s("warmup") > first_forwards_s(cfg).warm_s > 0
    assert "first forward alone" in next(p.detail for p in budget.phases if p.name == "warmup")
    dp = default("benchmark.warmup.policy=dataset", "layout.prefill.0.dp=2", "layout.prefill.0.dp_attention=true")
    (ranked,) = bench_first_forwards(dp)
    assert (ranked.ranks, ranked.chunk_tokens) == (2, first.chunk_tokens // 2)
    assert first_forwards_s(dp).warm_s == pytest.approx(2 * alone(dp, ranked.prompt_len))
    assert first_forwards_s(default("benchmark.warmup.policy=sglang")).warm_s == 0.0


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


def _startup_phases_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("qwen3_startup_phases", ROOT / "benchmarks/qwen3_startup_phases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_local_cluster_the_run_starts_costs_the_placement_its_raw_bench_logs_show():
    """cluster.address local + SGLang: placement is the median 'Phase placement' of the bench runs through the
    product's local cluster on lent GPU machines (none of them a run the figure is tested on), not the 15 s of a
    cluster already up; a cluster already up keeps its figure."""
    import statistics

    from orchestrator.plan.deadline import LOCAL_CLUSTER_PLACEMENT_S, PLACEMENT_S, cluster_start_s, placement_s

    phases = _startup_phases_script()
    local = [s for _, s in phases.placements(phases.LOCAL_CLUSTER_LOGS)]
    running = [s for _, s in phases.placements(phases.RUNNING_CLUSTER_LOGS)]
    assert len(local) == 13 and LOCAL_CLUSTER_PLACEMENT_S["sglang"] == pytest.approx(statistics.median(local), abs=0.05)
    assert min(running) < PLACEMENT_S["sglang"] < max(running) < min(local)
    two_gpu = load_config(ROOT / "configs/device-h200x2-qwen3-serve.yaml")
    assert placement_s(two_gpu) == LOCAL_CLUSTER_PLACEMENT_S["sglang"]
    assert cluster_start_s(two_gpu) == pytest.approx(LOCAL_CLUSTER_PLACEMENT_S["sglang"] - PLACEMENT_S["sglang"])
    placed = {p.name: p.predicted_s for p in predict_deadline(two_gpu, [(4000, 200)] * 4).phases}
    assert placed["placement"] == LOCAL_CLUSTER_PLACEMENT_S["sglang"]
    from orchestrator.plan.closedloop.predict import predict_ready

    ready = predict_ready(two_gpu, "H200").as_json()  # `serve` starts the cluster; `prepare`'s compile clock does not
    assert ready["placement_s"] - ready["cluster_start_s"] == PLACEMENT_S["sglang"]
    # a simulated config's local cluster runs the simulation: its real deployment's ready has no cluster start in it
    contest = predict_ready(load_config(ROOT / "configs/qwen3-pd-2026.yaml"), "H100-SXM").as_json()
    assert (contest["placement_s"], contest["cluster_start_s"]) == (PLACEMENT_S["sglang"], 0.0)
    already_up = load_config(ROOT / "configs/device-h200x2-qwen3-serve.yaml", ["cluster.address=ray://10.0.0.1:10001"])
    assert placement_s(already_up) == PLACEMENT_S["sglang"]


def test_the_embedded_defaults_placement_is_what_its_bench_runs_on_the_2_core_box_spent():
    """The simulated engine runs on the box bench runs on: its placement is the median placement of the committed
    bench runs of configs/default.yaml there (benchmarks/placement_steps.py), the cluster's start when bench starts
    one, Serve and the replicas on a cluster already up; `plan` names the raw folder."""
    import json
    import statistics

    from orchestrator.plan.deadline import LOCAL_CLUSTER_PLACEMENT_S, PLACEMENT_S, cluster_start_s, placement_s

    folder = ROOT / "benchmarks/results/2026-11-27-sim-placement-steps"
    runs = [json.loads(line) for line in (folder / "output.txt").read_text().splitlines() if line.startswith("{")]
    own = [r["placement_s"] for r in runs if "prefill raylet" in r["steps"]]
    running = [r["placement_s"] for r in runs if "prefill raylet" not in r["steps"]]
    assert (len(own), len(running)) == (5, 3)
    assert LOCAL_CLUSTER_PLACEMENT_S["sim"] == pytest.approx(statistics.median(own), abs=0.05)
    assert PLACEMENT_S["sim"] == pytest.approx(statistics.median(running), abs=0.05)
    assert placement_s(default()) == LOCAL_CLUSTER_PLACEMENT_S["sim"]
    assert cluster_start_s(default()) == pytest.approx(LOCAL_CLUSTER_PLACEMENT_S["sim"] - PLACEMENT_S["sim"])
    already_up = default("cluster.address=ray://10.0.0.1:10001")
    assert placement_s(already_up) == PLACEMENT_S["sim"] and cluster_start_s(already_up) == 0.0
    placement = predict_deadline(default(), [(4000, 200)] * 4).phases[0]
    assert placement.name == "placement" and folder.name in placement.detail


def test_with_empty_caches_the_first_graph_size_compiles_what_the_others_reuse():
    """A cold capture's compile is paid once, at the first size (the profile's cold log: V2-Lite's first of 36
    sizes took 51.7 of 64.0 s), so a server capturing 12 sizes pays all of it, not 12/36; the 36-size start the
    profile measured is predicted as measured either way."""
    from orchestrator.perfmodel.profile import CalibrationProfile

    phases = _startup_phases_script()
    lender = load_config(ROOT / "configs/device-h200x2-qwen3-serve.yaml")
    decode = cost_model_for(lender, "decode", lender.layout.decode[0], gpu="H200")
    st = decode.calibration.startup
    profile = CalibrationProfile.model_validate_json(
        (ROOT / "orchestrator/perfmodel/profiles/h200-deepseek-v2-lite-bf16-sglang0.5.17-pd-logs.json").read_text())
    cold_run = next(r for r in profile.startup if r.caches == "cold")
    import tarfile

    with tarfile.open(ROOT / "benchmarks/results/device-h200x2-2026-11-21/raw.tar.xz") as tar:
        log = tar.extractfile("c2/call1/agg0.log").read().decode()
    assert phases.first_size(log) == (36, pytest.approx(cold_run.first_graph_capture_s))
    warm_size = st.graph_bs_layer_s * profile.model.num_hidden_layers
    assert st.graph_once_cold_s == pytest.approx(cold_run.first_graph_capture_s - warm_size)
    assert 36 * warm_size + st.graph_once_cold_s + 35 * st.graph_bs_cold_s == pytest.approx(cold_run.graph_capture_s)
    parts = {c: decode.startup_breakdown_s("dummy", 2.0, jit_cached=c) for c in (True, False)}
    sizes = len(decode.graph_batch_sizes())
    assert sizes == 12
    assert parts[False]["cuda_graphs"] - parts[True]["cuda_graphs"] == pytest.approx(
        st.graph_once_cold_s + 11 * st.graph_bs_cold_s)
    assert parts[False]["cuda_graphs"] > 0.75 * cold_run.graph_capture_s
    # the prefill server captures no decode graph: its first forward compiles the same kernels
    prefill = cost_model_for(lender, "prefill", lender.layout.prefill[0], gpu="H200")
    assert prefill.graph_batch_sizes() == [] or len(prefill.graph_batch_sizes()) == 0
    cold_prefill = prefill.startup_breakdown_s("dummy", 2.0, jit_cached=False)
    assert cold_prefill["jit"] == pytest.approx(st.jit_cold_s + st.graph_once_cold_s)


def test_a_fresh_machine_s_warm_up_carries_the_pd_prefill_s_first_prompt_compile() -> None:
    # lease 13 (benchmarks/results/2026-11-27-lease13-h100/call5-pd: this config, this 1000-prompt batch, a fresh H100):
    # warm-up phase 14.80 s, 12.5 s of it the prefill's first prompt forward (10.2 s) and its remainder (2.3 s)
    # compiling; priced warm (1.6 s) before the cold compile entered the warm-up. Bound set with this test: 15 %
    from orchestrator.plan.backtest.dataset import DATASET, build_batch

    cfg = load_config(ROOT / "configs/device-h100x1-1p1d.yaml")
    batch = build_batch({"file": "sharegpt-full-1000-seed2025-v2lite.json"}, DATASET.parent)
    run = simulate_run(cfg, batch[:8], gpu="H100-SXM")  # the run phase is not what this checks
    cold = predict_deadline(cfg, batch, gpu="H100-SXM", jit_cached=False, run=run)
    warm = predict_deadline(cfg, batch, gpu="H100-SXM", jit_cached=True, run=run)
    assert cold.phase_s("warmup") == pytest.approx(14.80, rel=0.15)
    assert warm.phase_s("warmup") < 3.0 and cold.warmup_compile_s == pytest.approx(
        cold.phase_s("warmup") - warm.phase_s("warmup"))
    assert "cold compile" in next(p.detail for p in cold.phases if p.name == "warmup")
    # the line naming the other caches' total moves the compile with them
    assert f"with warm caches the total is {warm.total_s:.0f} s" in cold.table()
    assert f"with cold caches the total is {cold.total_s:.0f} s" in warm.table()


def test_the_report_phase_the_committed_sglang_bench_logs_show():
    """bench's wall after its measured run (results, plots, metrics scrape, stopping the servers) in the 15 SGLang
    runs on lent GPUs that exited 0 (benchmarks/report_phase.py, raw output 2026-11-27-report-phase): median 22.0 s,
    what the planner charges;
    in call 11's archive results and plots took 2 s of it and SGLang's SIGTERM came 4 s after the run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("report_phase", ROOT / "benchmarks/report_phase.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    runs = script.all_runs()
    assert len(runs) == 15 and {r["prompts"] for r in runs} == {1000}
    from orchestrator.plan.deadline import REPORT_S

    assert script.median_report_s() == pytest.approx(22.0, abs=0.05) == REPORT_S["sglang"]
    assert min(r["report"] for r in runs) == pytest.approx(15.56) and max(r["report"] for r in runs) == pytest.approx(23.39)
    events = dict((event, stamp) for stamp, event in script.breakdown())
    assert events["file last written: result.json"] == "04:10:36" and events["file last written: report.html"] == "04:10:38"
    assert any(e.startswith("SGLang: SIGTERM") and s == "04:10:40" for e, s in events.items())
