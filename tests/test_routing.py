"""Routing policies choose among healthy, non-suspect workers: round robin cycles, least-outstanding balances."""

from __future__ import annotations

import time

import pytest

from orchestrator.records import WorkerEndpoint
from orchestrator.router.policies import LeastOutstanding, NoWorkerError, RoundRobin, WorkerState, eligible, make_policy


def worker(name: str, role: str = "decode", outstanding: int = 0, healthy: bool = True,
           suspect_for_s: float = 0.0) -> WorkerState:
    w = WorkerState(WorkerEndpoint(role=role, name=name, url=f"http://127.0.0.1:1/{name}"))
    w.outstanding = outstanding
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
    with pytest.raises(ValueError, match=r"router.policy='random' is unknown; allowed: \['least_outstanding'"):
        make_policy("random")
    assert isinstance(make_policy("round_robin"), RoundRobin)
