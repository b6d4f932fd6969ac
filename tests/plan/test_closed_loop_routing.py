"""A closed loop of identical greedy requests on dummy weights: what its decode steps read, and what its ITL is.

The promise (perfmodel/weights.decode_routing_tokens): on dummy weights requests whose prompts end in the same token
decode the same greedy cycle of at most 2 tokens, and every request of a closed loop is one chat turn through one
template, so a decode step of B of them routes like min(B, 2) tokens, not B. Real weights, a ShareGPT batch (each
prompt its own chain in the planner) and every prefill forward keep one routing token per token. And the ITL a
closed-loop point reports is the decode step at the batch that loop runs, nothing else.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.weights import decode_routing_tokens
from orchestrator.plan.closedloop.client import CHAT_TURN_CHAIN, ClosedLoopLoad, simulate_closed_loop
from orchestrator.plan.simulation.simulate import simulate_run

ROOT = Path(__file__).resolve().parents[2]
TWO_GPU = ROOT / "configs" / "device-h200x2-qwen3-serve.yaml"  # closed loop, dummy weights, a GPU per server
BATCH_DUMMY = ROOT / "configs" / "device-h200x2-local-1p1d.yaml"  # a ShareGPT prompt batch on dummy weights


def _decode_model(path: Path, overrides: list[str] | None = None):
    cfg = load_config(path, overrides or [], paths_from=ROOT)
    _, _, group = next(g for g in cfg.layout.groups() if g[0] == "decode")
    return cost_model_for(cfg, "decode", group)


def test_the_rule_counts_two_tokens_per_greedy_chain_and_one_per_request_of_its_own():
    assert [decode_routing_tokens("dummy", ["turn"] * b) for b in (1, 2, 4, 64)] == [1, 2, 2, 2]
    assert decode_routing_tokens("dummy", ["a", "a", "a", "b", None, None]) == 2 + 1 + 2
    assert decode_routing_tokens("dummy", ["a", "b", None], tokens_per_request=3) == 2 + 2 + 3  # speculative verify
    assert decode_routing_tokens(None, ["turn"] * 64) is None  # real weights: every token its own


def test_a_decode_step_of_one_chain_on_dummy_weights_reads_the_experts_of_two_tokens():
    model = _decode_model(TWO_GPU)
    routed = [model._weight_bytes_read(b, routing_tokens=decode_routing_tokens(model.load_format, ["turn"] * b))[1]
              for b in (1, 2, 4, 16, 64)]
    assert routed[0] < routed[1] == routed[2] == routed[3] == routed[4]
    assert routed[1] == model._weight_bytes_read(2)[1]
    ctx = 4100
    for b in (4, 16, 64):  # fewer experts read, a shorter step; the same step where the batch holds <= 2 tokens
        assert model.decode_step_s(b, b * ctx, ["turn"] * b) < model.decode_step_s(b, b * ctx)
        assert model.decode_step_s(b, b * ctx, list(range(b))) == model.decode_step_s(b, b * ctx)  # distinct chains
    assert model.decode_step_s(2, 2 * ctx, ["turn"] * 2) == model.decode_step_s(2, 2 * ctx)


def test_real_weights_keep_one_routing_token_per_request():
    model = _decode_model(TWO_GPU, ["engine.sglang.load_format=null"])
    assert model.decode_step_s(16, 16 * 4100, ["turn"] * 16) == model.decode_step_s(16, 16 * 4100)
    assert model._weight_bytes_read(16)[1] > model._weight_bytes_read(2)[1]


def test_a_sharegpt_batch_on_dummy_weights_names_no_chain_and_keeps_its_steps():
    cfg = load_config(BATCH_DUMMY, ["benchmark.num_prompts=24"], paths_from=ROOT)
    model = _decode_model(BATCH_DUMMY, ["benchmark.num_prompts=24"])
    decode_steps: list = []

    def observe(now, server, forward, schedule):
        if server.startswith("decode") and forward.kind == "decode":
            decode_steps.append((forward, schedule.running_context))

    simulate_run(cfg, [(300 + 40 * i, 30) for i in range(24)], observe=observe)
    assert decode_steps and max(len(f.running) for f, _ in decode_steps) > 2
    for forward, contexts in decode_steps:
        assert all(seq.greedy_chain is None for seq in forward.running)
        assert forward.duration_s == model.decode_step_s(len(forward.running), contexts)


def test_closed_loop_itl_is_the_decode_step_at_the_batch_the_loop_runs():
    cfg = load_config(TWO_GPU, paths_from=ROOT)
    model = _decode_model(TWO_GPU)
    decode_steps: list = []  # (start s, forward, context tokens of its batch)

    def observe(now, server, forward, schedule):
        if server.startswith("decode") and forward.kind == "decode":
            decode_steps.append((now, forward, schedule.running_context))

    run = simulate_closed_loop(cfg, ClosedLoopLoad(4, 4000, 200, 3.0, 2.0), observe=observe)
    assert len(run.requests) >= 8
    for _, forward, contexts in decode_steps:  # each step: the model's step at the batch, contexts and chain it ran
        assert {seq.greedy_chain for seq in forward.running} == {CHAT_TURN_CHAIN}
        assert forward.duration_s == pytest.approx(
            model.decode_step_s(len(forward.running), contexts, [CHAT_TURN_CHAIN] * len(forward.running)), rel=1e-9)
    for timing in run.requests:  # its ITL: the mean of the decode steps it was in, one per output token after the first
        steps = [f.duration_s for start, f, _ in decode_steps
                 if timing.first_token_s - 1e-12 <= start < timing.end_s - 1e-12
                 and any(seq.owner.sent_s == timing.sent_s and seq.owner.first_token_s == timing.first_token_s
                         for seq in f.running)]
        assert len(steps) == timing.output_tokens - 1
        # ITL is taken from whole-ns instants, as AIPerf measures them: within 1 ns over the answer's token gaps
        assert timing.itl_s == pytest.approx(statistics.fmean(steps), rel=0, abs=1e-9 / len(steps))


def test_the_dummy_loaders_greedy_chains_end_in_cycles_of_at_most_two_tokens():
    """weights.DUMMY_GREEDY_CYCLE_TOKENS's argument, on a small random stream (benchmarks/qwen3_closed_loop_terms.py)."""
    from benchmarks.qwen3_closed_loop_terms import greedy_cycles

    ended, starts = greedy_cycles(rows=512, width=128, starts=100)
    assert ended == starts


def test_plan_says_which_decode_steps_route_as_two_tokens():
    from orchestrator.plan.closedloop.predict import calibration_sources

    cfg = load_config(TWO_GPU, paths_from=ROOT)
    lines = calibration_sources(cfg, "H200")
    assert [("routes as at most 2 tokens" in line) for line in lines] == [False, True, False]  # prefill, decode, capture
    assert lines[2].startswith("layout.decode.0: decode-graph capture at 6 layers from a figure measured at 27")
    real = load_config(TWO_GPU, ["engine.sglang.load_format=null"], paths_from=ROOT)
    assert not any("routes as at most" in line for line in calibration_sources(real, "H200"))
