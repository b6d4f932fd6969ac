"""Routing policies choose among healthy, non-suspect workers: round robin cycles, least-outstanding and
least-tokens balance, power-of-two samples, prefix-aware follows cached prefixes; the dispatcher keeps the
tokens in flight that they read."""

from __future__ import annotations

import time

import pytest

from orchestrator.records import WorkerEndpoint
from orchestrator.router.dispatch.dispatcher import PDDispatcher
from orchestrator.router.dispatch.pairs import request_shape
from orchestrator.router.dispatch.policies import POLICIES, LeastOutstanding, LeastTokens, NoWorkerError, PowerOfTwo, PrefixAware, RequestShape, RoundRobin, WorkerState, eligible, make_policy


def worker(name: str, role: str = "decode", outstanding: int = 0, healthy: bool = True,
           suspect_for_s: float = 0.0, tokens: int = 0) -> WorkerState:
    w = WorkerState(WorkerEndpoint(role=role, name=name, url=f"http://127.0.0.1:1/{name}"))
    w.outstanding = outstanding
    w.outstanding_tokens = tokens
    w.healthy = healthy
    if suspect_for_s:
        w.suspect_until = time.monotonic() + suspect_for_s
    return w


def test_round_robin_visits_every_worker_in_turn():
    ws = [worker("d-2"), worker("d-0"), worker("d-1")]
    rr = RoundRobin()
    picks = [rr.pick(ws).name for _ in range(6)]
    assert picks == ["d-0", "d-1", "d-2", "d-0", "d-1", "d-2"]


def test_round_robin_keeps_cycling_when_a_worker_leaves():
    rr = RoundRobin()
    a, b, c = worker("a"), worker("b"), worker("c")
    assert rr.pick([a, b, c]).name == "a"
    assert rr.pick([a, b, c]).name == "b"
    assert rr.pick([a, c]).name == "c"  # b gone: continue after it, not from the start
    assert rr.pick([a, c]).name == "a"


def test_least_outstanding_picks_the_least_loaded():
    ws = [worker("a", outstanding=3), worker("b", outstanding=1), worker("c", outstanding=2)]
    assert LeastOutstanding().pick(ws).name == "b"


def test_least_outstanding_rotates_among_equally_loaded():
    ws = [worker("a", outstanding=1), worker("b", outstanding=1), worker("c", outstanding=5)]
    lo = LeastOutstanding()
    assert [lo.pick(ws).name for _ in range(4)] == ["a", "b", "a", "b"]


def test_eligible_skips_unhealthy_suspect_and_other_roles():
    ws = [worker("p", role="prefill"), worker("sick", healthy=False), worker("sus", suspect_for_s=60),
          worker("ok")]
    assert [w.name for w in eligible(ws, "decode")] == ["ok"]


def test_eligible_falls_back_to_suspects_rather_than_nothing():
    ws = [worker("sus-1", suspect_for_s=60), worker("sus-2", suspect_for_s=60)]
    assert {w.name for w in eligible(ws, "decode")} == {"sus-1", "sus-2"}


def test_suspicion_expires():
    w = worker("d", suspect_for_s=60)
    assert w.is_suspect()
    assert not w.is_suspect(now=w.suspect_until + 0.001)


def test_no_healthy_worker_names_the_role_and_count():
    with pytest.raises(NoWorkerError, match=r"no healthy prefill worker \(1 registered\)"):
        eligible([worker("p", role="prefill", healthy=False)], "prefill")


def test_unknown_policy_names_the_field_and_choices():
    with pytest.raises(ValueError, match=r"router.policy='cache_aware' is unknown; allowed: \['least_outstanding'"):
        make_policy("cache_aware")
    assert isinstance(make_policy("round_robin"), RoundRobin)


def test_least_tokens_weighs_work_not_request_count():
    # b has more requests in flight but far fewer tokens: the KV it must hold is what fills a decode
    ws = [worker("a", outstanding=1, tokens=9000), worker("b", outstanding=4, tokens=800)]
    assert LeastTokens().pick(ws).name == "b"
    assert LeastOutstanding().pick(ws).name == "a"


def test_power_of_two_takes_the_lighter_of_two_and_never_the_heaviest_of_three():
    ws = [worker("a", tokens=100), worker("b", tokens=5000), worker("c", tokens=300)]
    p2c = PowerOfTwo(seed=7)
    picks = [p2c.pick(ws).name for _ in range(300)]
    assert "b" not in picks  # the heaviest loses every pairing it is sampled into
    assert {"a", "c"} <= set(picks)  # c wins when it is sampled with b


def test_prefix_aware_sends_a_shared_prefix_back_to_the_worker_that_saw_it():
    system = list(range(1000, 1512))  # a long shared system prompt (32 blocks of 16)
    ws = [worker("p-0", role="prefill"), worker("p-1", role="prefill")]
    policy = PrefixAware(block_tokens=16)
    first = policy.pick(ws, RequestShape(len(system) + 3, 8, system + [1, 2, 3]))
    first.outstanding_tokens += 100  # now busier than the other one
    again = policy.pick(ws, RequestShape(len(system) + 3, 8, system + [7, 8, 9]))
    assert again is first
    other = policy.pick(ws, RequestShape(40, 8, list(range(40))))  # no shared prefix: least loaded
    assert other is not first


def test_prefix_aware_leaves_the_cached_worker_when_its_queue_costs_more_than_the_prefill():
    system = list(range(512))
    ws = [worker("p-0", role="prefill"), worker("p-1", role="prefill")]
    policy = PrefixAware(block_tokens=16)
    first = policy.pick(ws, RequestShape(515, 8, system + [1, 2, 3]))
    first.outstanding_tokens += 400  # less than the 512 cached tokens would cost elsewhere: stay
    assert policy.pick(ws, RequestShape(515, 8, system + [4, 5, 6])) is first
    assert policy.new_tokens(first, RequestShape(515, 8, system + [4, 5, 6])) == 3  # only the uncached tail
    first.outstanding_tokens += 5000  # now its queue costs more than prefilling everything on the other
    assert policy.pick(ws, RequestShape(515, 8, system + [7, 8, 9])) is not first


def test_prefix_aware_forgets_the_least_recently_used_prefixes_beyond_its_capacity():
    ws = [worker("p-0", role="prefill"), worker("p-1", role="prefill")]
    policy = PrefixAware(block_tokens=16, capacity_tokens=64)  # room for 4 blocks per worker
    old = list(range(64))
    first = policy.pick(ws, RequestShape(64, 1, old))
    policy.pick([first], RequestShape(64, 1, list(range(500, 564))))  # pushes `old` out of first's index
    first.outstanding_tokens += 10
    assert policy.pick(ws, RequestShape(64, 1, old)) is not first


def test_every_policy_name_builds_a_policy_per_role_and_the_config_accepts_it():
    from orchestrator.config import RunConfig

    allowed = RunConfig.model_fields["router"].annotation.model_fields["policy"].annotation.__args__
    assert sorted(allowed) == sorted(POLICIES)
    assert isinstance(make_policy("prefix_aware", "prefill"), PrefixAware)
    assert isinstance(make_policy("prefix_aware", "decode"), LeastTokens)


def test_request_shape_counts_every_prompt_of_a_batch_and_sglangs_default_output():
    shape = request_shape({"input_ids": [[1, 2, 3], [4, 5]], "sampling_params": {"max_new_tokens": 10}})
    assert (shape.prompt_tokens, shape.max_new_tokens, list(shape.prompt_ids)) == (5, 20, [1, 2, 3])
    assert request_shape({"input_ids": [1, 2]}).max_new_tokens == 128


def test_dispatcher_holds_tokens_in_flight_per_leg_and_releases_them():
    d = PDDispatcher()
    d.set_workers([WorkerEndpoint("prefill", "p", "http://127.0.0.1:1"), WorkerEndpoint("decode", "d", "http://127.0.0.1:2")])
    pair = d.pick_pair(RequestShape(prompt_tokens=100, max_new_tokens=20))
    assert (pair.prefill_tokens, pair.decode_tokens) == (100, 120)
    d.leg_start(pair.prefill, pair.prefill_tokens)
    d.leg_start(pair.decode, pair.decode_tokens)
    assert (d.workers["p"].outstanding_tokens, d.workers["d"].outstanding_tokens) == (100, 120)
    d.leg_done(pair.prefill, pair.prefill_tokens)
    d.leg_done(pair.decode, pair.decode_tokens)
    assert (d.workers["p"].outstanding_tokens, d.workers["d"].outstanding_tokens) == (0, 0)
