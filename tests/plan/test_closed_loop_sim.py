"""The planner's closed-loop client: N clients resending identical requests move in lockstep waves.

A steady-state queue model (requests arriving spread out, served at an average rate) predicts one TTFT for all and
the same ITL for all; what a real one-GPU run showed, and what these tests hold the simulator to, is different:
N identical requests sent together prefill one chunk after another (TTFT steps up through the wave; the
first alone, as an idle server's first forward is), a request
prefilled early waits while the rest prefill (its ITL carries the stall), all finish on the same step and are
resent together, so the next wave repeats the first.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.plan.closedloop.client import ClosedLoopLoad, simulate_closed_loop
from orchestrator.plan.simulation.simulate import SimulationError

QWEN = Path(__file__).resolve().parents[2] / "configs" / "qwen3-pd-2026.yaml"
ONE_AGGREGATED_TP4 = ["layout.mode=aggregated", "layout.prefill=[]", "layout.decode=[]",
                      "layout.aggregated=[{count: 1, tp: 4, chunked_prefill_size: 8192}]"]


def _waves(overrides, n, window_s=20.0):
    cfg = load_config(QWEN, overrides)
    return simulate_closed_loop(cfg, ClosedLoopLoad(n, 4000, 200, window_s, 30.0))


def test_identical_requests_sent_together_stay_together_in_waves():
    run = _waves(ONE_AGGREGATED_TP4, 8)
    waves = run.waves()
    assert len(waves) >= 3 and all(len(w) == 8 for w in waves)  # every send instant carries all N clients
    # each wave repeats the first: the same TTFT and ITL per position (a closed loop, not a drifting queue)
    first = sorted((round(r.ttft_s, 9), round(r.itl_s, 9)) for r in waves[0])
    assert all(sorted((round(r.ttft_s, 9), round(r.itl_s, 9)) for r in w) == first for w in waves[1:])
    assert run.not_counted == 0


def test_ttft_steps_up_through_a_wave_one_prefill_forward_per_two_prompts_after_the_first():
    wave = _waves(ONE_AGGREGATED_TP4, 8).waves()[0]
    ttfts = sorted({round(r.ttft_s, 6) for r in wave})
    # an idle server's first forward holds the first request alone (scheduling/steps.py); then chunked prefill 8192
    # takes two 4000-token prompts per forward: 8 prompts, 1 + 3 pairs + 1, 5 TTFT levels
    assert len(ttfts) == 5
    assert [sum(round(r.ttft_s, 6) == t for r in wave) for t in ttfts] == [1, 2, 2, 2, 1]
    pair_steps = [b - a for a, b in zip(ttfts[:3], ttfts[1:4])]  # the three pairs' forwards
    assert max(pair_steps) == pytest.approx(min(pair_steps), rel=0.01)
    assert ttfts[1] - ttfts[0] > ttfts[-1] - ttfts[-2]  # a pair's forward is longer than the last one alone


def test_a_request_prefilled_early_stalls_while_the_rest_prefill():
    wave = _waves(ONE_AGGREGATED_TP4, 8).waves()[0]
    assert len({round(r.end_s, 9) for r in wave}) == 1  # all end on the same decode step
    early, late = min(wave, key=lambda r: r.ttft_s), max(wave, key=lambda r: r.ttft_s)
    # the early one's first token came out, then no decode step ran until the last prompt was prefilled:
    # its whole stall is spread over its 199 inter-token gaps
    assert early.itl_s - late.itl_s == pytest.approx((late.ttft_s - early.ttft_s) / 199, rel=1e-6)
    assert early.itl_s > late.itl_s


def test_pd_waves_spread_ttft_over_the_prefill_servers_forwards():
    run = _waves([], 8)
    wave = run.waves()[0]
    assert len(wave) == 8 and wave[0].sent_s == 0.0
    # 2 prefill servers x 2 prompts per forward: the second forward's prompts wait for the first
    assert max(r.ttft_s for r in wave) > 1.8 * min(r.ttft_s for r in wave)
    # a closed loop holds N in flight: over the window every client keeps resending
    e2e = sum(r.end_s - r.sent_s for r in run.requests) / len(run.requests)
    assert len(run.requests) == pytest.approx(8 * 20.0 / e2e, rel=0.25)


def test_more_clients_more_output_and_longer_ttft_tails():
    low, high = _waves([], 8), _waves([], 32)
    assert high.output_tok_s > 1.5 * low.output_tok_s
    assert high.ttft_ms()["p99"] > low.ttft_ms()["p99"]
    assert high.itl_ms()["p50"] > low.itl_ms()["p50"]  # a bigger decode batch steps slower


def test_a_request_longer_than_the_context_is_refused_in_one_line():
    cfg = load_config(QWEN, ["model.context_length=4096"])
    with pytest.raises(SimulationError, match="exceeds model.context_length=4096; raise model.context_length"):
        simulate_closed_loop(cfg, ClosedLoopLoad.of(cfg, 8))


def _decode_batches(overrides: list[str], n: int = 16) -> dict[str, int]:
    """The largest batch each decode server ran in a 10 s window of N clients."""
    largest: dict[str, int] = {}

    def observe(_t, server, forward, _schedule) -> None:
        if forward.kind == "decode":
            largest[server] = max(largest.get(server, 0), len(forward.running))

    simulate_closed_loop(load_config(QWEN, overrides), ClosedLoopLoad(n, 4000, 200, 10.0, 30.0), observe=observe)
    return largest


def test_random_pairing_lets_one_decode_run_more_than_its_half_of_the_clients():
    # round robin's shared turn gives each of the two decodes exactly half of N; sglang-router's random pairs (the
    # organisers' deployment) draw the decode apart, so one decode at times runs more than half (docs/router.md)
    assert set(_decode_batches([]).values()) == {8}
    assert max(_decode_batches(["router.policy=random"]).values()) > 8


def test_random_pairing_repeats_under_its_seed_and_draws_the_routers_streams():
    from orchestrator.plan.simulation.servers import Pairing
    from orchestrator.records import WorkerEndpoint
    from orchestrator.router.dispatch.policies import WorkerState, make_policy

    same = [_waves(["router.policy=random", f"router.seed={seed}"], 16).ttft_ms() for seed in (5, 5, 6)]
    assert same[0] == same[1] and same[0] != same[2]
    # the planner's router draws what `serve`'s router draws under the same seed, role by role
    for role in ("prefill", "decode"):
        planner = Pairing("random", seed=5)
        router = make_policy("random", role, seed=5)
        workers = [WorkerState(WorkerEndpoint(role=role, name=f"{role}-{i}", url=f"http://127.0.0.1:1/{i}"))
                   for i in range(3)]
        assert [planner.pick(role, workers, turn).name for turn in range(40)] == \
            [router.pick(workers).name for _ in range(40)]
