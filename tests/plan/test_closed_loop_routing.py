"""A closed loop of identical greedy requests on dummy weights: what its decode steps read, and what its ITL is.

The promise (perfmodel/weights.decode_routing_tokens): every client of a closed loop sends the same request, so on
dummy weights every request decodes the same 2-token greedy cycle, and a decode step of B of them routes like
min(B, 2) tokens, not B. Real weights, a prompt batch and every prefill forward keep one routing token per token.
And the ITL a closed-loop point reports is the decode step at the batch that loop runs, nothing else.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.plan.closedloop.client import ClosedLoopLoad, simulate_closed_loop

ROOT = Path(__file__).resolve().parents[2]
TWO_GPU = ROOT / "configs" / "device-h200x2-qwen3-serve.yaml"  # closed loop, dummy weights, a GPU per server
BATCH_DUMMY = ROOT / "configs" / "device-h200x2-local-1p1d.yaml"  # a ShareGPT prompt batch on dummy weights


def _decode_model(path: Path, overrides: list[str] | None = None):
    cfg = load_config(path, overrides or [], paths_from=ROOT)
    _, _, group = next(g for g in cfg.layout.groups() if g[0] == "decode")
    return cost_model_for(cfg, "decode", group)


def test_a_decode_step_of_identical_dummy_requests_reads_the_experts_of_two_tokens():
    model = _decode_model(TWO_GPU)
    uniform = replace(model, decode_routing_tokens=None)  # one routing token per request
    assert model.decode_routing_tokens == 2
    routed = [model._weight_bytes_read(b, decode=True)[1] for b in (1, 2, 4, 16, 64)]
    assert routed[0] < routed[1] == routed[2] == routed[3] == routed[4]
    assert routed[1] == uniform._weight_bytes_read(2, decode=True)[1]
    ctx = 4100
    for b in (4, 16, 64):  # fewer experts read, a shorter step; the same step where the batch holds <= 2 tokens
        assert model.decode_step_s(b, b * ctx) < uniform.decode_step_s(b, b * ctx)
    assert model.decode_step_s(2, 2 * ctx) == uniform.decode_step_s(2, 2 * ctx)
    # a prefill forward routes every prompt token on its own
    assert model.prefill_time_s([4000, 4000]) == uniform.prefill_time_s([4000, 4000])


@pytest.mark.parametrize("path,overrides", [
    (TWO_GPU, ["engine.sglang.load_format=null"]),  # real weights: each token its own experts
    (BATCH_DUMMY, []),  # a prompt batch: different prompts, different greedy cycles
])
def test_real_weights_and_prompt_batches_keep_one_routing_token_per_request(path, overrides):
    model = _decode_model(path, overrides)
    assert model.decode_routing_tokens is None
    assert model._weight_bytes_read(16, decode=True)[1] > model._weight_bytes_read(2, decode=True)[1]


def test_closed_loop_itl_is_the_decode_step_at_the_batch_the_loop_runs():
    cfg = load_config(TWO_GPU, paths_from=ROOT)
    model = _decode_model(TWO_GPU)
    decode_steps: list = []  # (start s, forward, context tokens of its batch)

    def observe(now, server, forward, schedule):
        if server.startswith("decode") and forward.kind == "decode":
            decode_steps.append((now, forward, schedule.running_context))

    run = simulate_closed_loop(cfg, ClosedLoopLoad(4, 4000, 200, 3.0, 2.0), observe=observe)
    assert len(run.requests) >= 8
    for _, forward, contexts in decode_steps:  # each step: the model's step at the batch and contexts it ran
        assert forward.duration_s == pytest.approx(model.decode_step_s(len(forward.running), contexts), rel=1e-9)
    for timing in run.requests:  # its ITL: the mean of the decode steps it was in, one per output token after the first
        steps = [f.duration_s for start, f, _ in decode_steps
                 if timing.first_token_s - 1e-12 <= start < timing.end_s - 1e-12
                 and any(seq.owner.sent_s == timing.sent_s and seq.owner.first_token_s == timing.first_token_s
                         for seq in f.running)]
        assert len(steps) == timing.output_tokens - 1
        assert timing.itl_s == pytest.approx(statistics.fmean(steps), rel=1e-9)


def test_the_dummy_loaders_greedy_chains_end_in_cycles_of_at_most_two_tokens():
    """weights.DUMMY_GREEDY_CYCLE_TOKENS's argument, on a small random stream (benchmarks/qwen3_closed_loop_terms.py)."""
    from benchmarks.qwen3_closed_loop_terms import greedy_cycles

    ended, starts = greedy_cycles(rows=512, width=128, starts=100)
    assert ended == starts


def test_plan_says_which_decode_steps_route_as_two_tokens():
    from orchestrator.plan.closedloop.predict import calibration_sources

    cfg = load_config(TWO_GPU, paths_from=ROOT)
    lines = calibration_sources(cfg, "H200")
    assert [("routes as at most 2 tokens" in line) for line in lines] == [False, True]  # prefill, decode
    real = load_config(TWO_GPU, ["engine.sglang.load_format=null"], paths_from=ROOT)
    assert not any("routes as at most" in line for line in calibration_sources(real, "H200"))
