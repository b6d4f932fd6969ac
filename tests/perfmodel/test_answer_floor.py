"""The answer floor of a lone short prompt: an eager prefill's CPU launch where nothing hides it, and the per-request
answer latency, both traced to the raw files they come from (benchmarks/answer_latency.py)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.config.model_presets import DEEPSEEK_R1, MODEL_PRESETS
from orchestrator.perfmodel import sglang_defaults as sgd
from orchestrator.perfmodel.costmodel import build_cost_model
from orchestrator.perfmodel.gpus import gpu_spec
from orchestrator.perfmodel.scheduling.limits import Seq, ServerLimits
from orchestrator.perfmodel.scheduling.steps import StepScheduler

ROOT = Path(__file__).resolve().parents[2]
R1_SHAPE = replace(DEEPSEEK_R1, num_hidden_layers=6, first_k_dense_replace=3)


def _r1_tp2():
    return build_cost_model(R1_SHAPE, "H200", "fp8", attention_backend="triton", load_format="dummy", tp=2,
                            context_length=16384, mem_fraction_static=0.7, cuda_graph_max_bs=512)


def test_sglang_0_5_captures_prefill_graphs_for_gqa_but_not_for_mla_and_0_4_for_none():
    assert sgd.prefill_graphs_captured("0.5.17", mla=False)
    assert not sgd.prefill_graphs_captured("0.5.17", mla=True)
    assert not sgd.prefill_graphs_captured("0.4.10", mla=False)
    qwen3 = build_cost_model(MODEL_PRESETS["qwen3-235b-a22b-fp8"], "H100-SXM", "fp8", tp=4)
    assert qwen3.prefill_launch_s(1) == 0.0  # a breakable prefill graph: no kernel-by-kernel launch priced
    assert _r1_tp2().prefill_launch_s(1) == pytest.approx(_r1_tp2().eager_launch_s(1, decode=False))


class _Cost:
    """A prefill of 5 ms GPU work and 15 ms of launch; decode steps of 30 ms."""

    def prefill_time_s(self, new_tokens, cached_tokens=None, chunk_follows=False) -> float:
        return 0.005

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        return 0.030

    def prefill_launch_s(self, requests: int) -> float:
        return 0.015


def _prefill_seconds(steps: StepScheduler) -> list[float]:
    out = []
    for _ in range(4):
        step = steps.schedule()
        if step.forward is None:
            break
        if step.forward.kind == "prefill":
            out.append(step.forward.duration_s)
        steps.update_from_output(step)
    return out


def test_a_prefill_on_an_idle_server_lasts_its_launch_and_one_behind_a_running_forward_its_gpu_work():
    steps = StepScheduler(ServerLimits("aggregated", 100_000, 64, 8192), _Cost())
    steps.submit(Seq(100, 3))
    first = steps.schedule()
    assert first.forward is not None and first.forward.duration_s == 0.015  # idle: nothing hides the launch
    steps.update_from_output(first)
    decode = steps.schedule()  # the first request decodes; a second arrives meanwhile
    steps.submit(Seq(100, 3))
    steps.update_from_output(decode)
    behind = steps.schedule()
    assert behind.forward is not None and behind.forward.kind == "prefill"
    assert behind.forward.duration_s == 0.005  # launched while the decode step ran (SGLang's overlap loop)


def test_without_the_overlap_loop_every_prefill_lasts_at_least_its_launch():
    steps = StepScheduler(ServerLimits("aggregated", 100_000, 64, 8192), _Cost(), overlap_launch=False)
    steps.submit(Seq(100, 3))
    steps.update_from_output(steps.schedule())
    decode = steps.schedule()
    steps.submit(Seq(100, 3))
    steps.update_from_output(decode)
    assert steps.schedule().forward.duration_s == 0.015


def test_the_shipped_answer_latency_is_what_the_in_sample_calibration_files_give():
    spec = importlib.util.spec_from_file_location("answer_latency", ROOT / "benchmarks" / "answer_latency.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    measured, points = module.answer_latency_s()
    assert len(points) == 5 and all(p["launch_bound"] for p in points)
    assert {p["server"] for p in points} == {"H100 R1 shape x6, TP 1", "H100 V2-Lite x27, TP 1"}  # in-sample only
    assert gpu_spec("H100-SXM").answer_latency_s == pytest.approx(measured, abs=0.05e-3)
    # and the out-of-sample TP 2 lone prompts it was not fitted on land within 5 %
    tp2 = module.lone_points("tp2", ROOT / "benchmarks/results/2026-11-26-two-gpu-tp2-h200x2/calibration-twogpu-tp2.json.xz",
                             "tp2", _r1_tp2())
    short = [p for p in tp2 if p["prompt"] <= 1024]
    assert len(short) == 2
    for p in short:
        assert p["measured_s"] / (p["forward_s"] + gpu_spec("H200").answer_latency_s) == pytest.approx(1.0, abs=0.05)
