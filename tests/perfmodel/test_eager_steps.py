"""Eager decode steps (a batch above the largest captured CUDA graph): launch-bound on the scheduler's CPU, so they
cost more than the graph replay at the same batch and barely grow with the batch (ForwardTerms.eager_launch_s, constants
fitted by benchmarks/eager_launch_cost.py on the one-GPU eager points)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from orchestrator.config.model_presets import DEEPSEEK_V2_LITE
from orchestrator.perfmodel.costmodel import build_cost_model
from orchestrator.perfmodel.gpus import gpu_spec

ROOT = Path(__file__).resolve().parents[2]


def _v2lite(tp: int = 1, graphs: int = 256, **server):
    return build_cost_model(DEEPSEEK_V2_LITE, "H200", "bf16", attention_backend="triton", load_format="dummy",
                            context_length=16384, cuda_graph_max_bs=graphs, role="decode", tp=tp, **server)


def _fit_script():
    spec = importlib.util.spec_from_file_location("eager_launch_cost", ROOT / "benchmarks/eager_launch_cost.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_an_eager_step_costs_more_than_the_graph_replay_at_the_same_batch() -> None:
    eager, graphed = _v2lite(graphs=256), _v2lite(graphs=1024)
    bs, ctx = 400, 400 * 500
    assert eager.decode_runs_eager(bs) and not graphed.decode_runs_eager(bs)
    # the H100 harness measured exactly this pair: 384 requests, 27.1 ms replayed vs 54.9-58.4 ms eager
    assert eager.decode_step_s(bs, ctx) > 1.4 * graphed.decode_step_s(bs, ctx)
    assert eager.decode_step_s(bs, ctx) == pytest.approx(eager.eager_launch_s(bs))


def test_an_eager_step_is_flat_in_the_batch_where_the_graph_replay_grows() -> None:
    model = _v2lite(graphs=256)
    small, large = model.decode_step_s(300, 300 * 500), model.decode_step_s(600, 600 * 500)
    # measured on one H200 (PD decode, 2026-11-21): 50-54 ms at 273-355 running, 56-64 ms at 489-547
    assert 1.0 < large / small < 1.15
    spec = gpu_spec("H200")
    assert large - small == pytest.approx(300 * spec.eager_launch_per_request_s, rel=1e-6)


def test_the_shipped_launch_constants_are_the_fit_on_the_one_gpu_eager_points() -> None:
    script = _fit_script()
    points = script.points()
    bound = [p for p in points if p["step_s"] >= script.LAUNCH_BOUND * p["graphed_s"]]
    # both layer counts take part, or per-step and per-layer could not be told apart
    assert {p["layers"] for p in bound} == {6, 27} and len(bound) >= 20
    spec = gpu_spec("H200")
    errors = []
    for p in points:
        launch = spec.eager_launch_step_s + p["layers"] * spec.eager_launch_layer_s + p["batch"] * spec.eager_launch_per_request_s
        errors.append(max(p["graphed_s"], launch) / p["step_s"] - 1)
    assert math.sqrt(sum(e * e for e in errors) / len(errors)) < 0.15


def test_a_tensor_parallel_eager_decode_layer_costs_what_tp2_minus_tp1_measured_on_one_host() -> None:
    one, two = _v2lite(tp=1), _v2lite(tp=2)
    # 27 layers x the per-layer TP 2 - TP 1 of lease 3's same-host eager points (0.606 ms), not 2 x 67 us of launches
    assert two.eager_launch_s(500) - one.eager_launch_s(500) == pytest.approx(27 * 0.606e-3, rel=1e-3)
    assert two.decode_step_s(500, 500 * 500) > 2.5 * two.decode_step_s(256, 256 * 500)
    assert two.decode_step_s(500, 500 * 500) - one.decode_step_s(500, 500 * 500) > 27 * 0.5e-3


def test_the_per_layer_tp_figure_is_the_mean_of_the_same_host_pairs() -> None:
    from benchmarks import same_host_ab
    from orchestrator.perfmodel.parallel.collectives import HOPPER

    tp1, tp2 = same_host_ab.points(same_host_ab.TP1, "tp1-eager"), same_host_ab.points(same_host_ab.TP2, "tp2-eager")
    gaps = same_host_ab.tp_layer_gaps_ms(tp1, tp2)
    assert sorted(gaps) == [1, 8, 32, 64, 128, 256]  # the six warm decode points measured at both TP sizes
    assert HOPPER.eager_tp_layer_s == pytest.approx(sum(gaps.values()) / len(gaps) * 1e-3, abs=1e-6)
    # what the model charged before (two eager all-reduce launches at NCCL's floor) is a quarter of the smallest gap
    assert 2 * HOPPER.eager_intra_latency_s < 0.35 * min(gaps.values()) * 1e-3


def test_prefill_forwards_and_groups_across_nodes_keep_the_collective_launch_floors() -> None:
    one, two = _v2lite(tp=1), _v2lite(tp=2)
    floors = 27 * 2 * 66.9e-6  # TP 2 - TP 1 was measured on decode steps inside one node only
    assert two.eager_launch_s(1, decode=False) - one.eager_launch_s(1, decode=False) == pytest.approx(floors, rel=1e-3)
    assert two.prefill_launch_s(1) == pytest.approx(two.eager_launch_s(1, decode=False))
    across = _v2lite(tp=16, nnodes=2)
    inside = _v2lite(tp=8)
    assert across.eager_launch_s(500) - one.eager_launch_s(500) == pytest.approx(floors, rel=1e-3)
    assert inside.eager_launch_s(500) - one.eager_launch_s(500) == pytest.approx(27 * 0.606e-3, rel=1e-3)


def test_a_pipeline_replays_the_graph_of_each_micro_batch() -> None:
    pp = _v2lite(graphs=256, pp=2)
    # 500 requests form two micro-batches of 250: each replays a captured graph; 600 form two of 300: eager
    assert not pp.decode_runs_eager(500) and pp.decode_runs_eager(600)
    assert pp.decode_step_s(600, 600 * 500) > 1.3 * pp.decode_step_s(500, 500 * 500)
