"""The simulated engine's scheduler and the planner's simulation schedule a trace alike: same first-token
forward, same last forward, same retractions, for every request, on an aggregated server and on a PD decode
server. Both clocks (paced wall time, virtual time) drive one perfmodel/scheduling/steps.py StepScheduler per
server; this checks that neither adds a decision of its own. Exact, no tolerance: with every forward taking the
same time and every request queued at once, only the scheduling decisions order the events. What this does not
cover: a PD pair's hand-off (the sim's handshake and transfer run in wall time over HTTP, the planner's in
virtual time), compared end to end by benchmarks/embedded_vs_plan.py (docs/performance.md)."""

from __future__ import annotations

import asyncio
import random

from orchestrator.engines.sim.scheduler import Scheduler, SchedulerLimits
from orchestrator.engines.sim.sim_request import SimRequest
from orchestrator.plan.simulation.simulate import one_server_trace


class OneSecondForwards:
    """Every forward takes the same time, so only the scheduling decisions decide the order of events."""

    def prefill_time_s(self, new_tokens, cached_tokens=None, chunk_follows=False) -> float:
        return 1.0

    def decode_step_s(self, batch_size: int, context_tokens: int, greedy_chains=None) -> float:
        return 1.0


def trace(n: int, seed: int, max_output: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(20, 400), rng.randint(1, max_output)) for _ in range(n)]


async def run_sim(batch: list[tuple[int, int]], limits: SchedulerLimits) -> list[SimRequest]:
    sched = Scheduler(OneSecondForwards(), limits, vocab_size=1000, eos_token_id=-1)
    rng = random.Random(7)  # distinct random prompts: the sim's prefix cache finds nothing (the plan has none)
    reqs = [SimRequest(f"r{i}", [rng.randrange(1000) for _ in range(p)], max_new_tokens=o, ignore_eos=True)
            for i, (p, o) in enumerate(batch)]
    for req in reqs:  # all queued before the loop runs, as the planner's client sends them at t=0
        sched.submit(req)
    sched.start()
    await asyncio.wait_for(asyncio.gather(*(r.finished_event.wait() for r in reqs)), 120)
    await sched.stop()
    assert sched.kv_used_tokens == 0 and sched.idle()
    return reqs


def schedule_of(seqs) -> list[tuple[int | None, int | None, int]]:
    return [(s.first_token_forward, s.done_forward, s.retractions) for s in seqs]


async def test_a_kv_bound_aggregated_server_admits_retracts_and_finishes_the_same_requests_at_the_same_forwards():
    batch = trace(100, seed=1, max_output=600)
    # 6,000 KV tokens for 100 requests of ~210 + ~300 tokens: admission is KV-bound, and once new_token_ratio
    # has decayed over ~2,900 forwards the optimistic admissions run out of KV and decode steps retract
    limits = SchedulerLimits(max_running_requests=32, kv_capacity_tokens=6000, chunked_prefill_tokens=512,
                             time_scale=0.0)  # one scheduler and every request queued at once: time decides nothing
    planned = one_server_trace(batch, OneSecondForwards(), limits.model_limits())
    simulated = await run_sim(batch, limits)
    assert sum(s.retractions for s in planned) > 0  # the trace exercises retraction, not only admission
    assert schedule_of(r.seq for r in simulated) == schedule_of(planned)
    assert [len(r.output_ids) for r in simulated] == [o for _, o in batch]


async def test_a_server_bound_by_max_running_and_the_chunk_budget_matches_too():
    batch = trace(40, seed=2, max_output=200)
    limits = SchedulerLimits(max_running_requests=8, kv_capacity_tokens=1_000_000, chunked_prefill_tokens=256,
                             time_scale=0.0)
    planned = one_server_trace(batch, OneSecondForwards(), limits.model_limits())
    simulated = await run_sim(batch, limits)
    assert sum(s.retractions for s in planned) == 0
    assert schedule_of(r.seq for r in simulated) == schedule_of(planned)


async def test_a_pd_decode_preallocates_retracts_to_host_and_resumes_at_the_same_forwards():
    batch = trace(80, seed=3, max_output=2000)
    # 10,000 KV tokens: pre-allocation keeps 512 tokens of headroom per request, long outputs outgrow it and
    # decode steps retract to host memory; each request's KV is there as soon as it is pre-allocated (the
    # sim's local path is SGLang's fake transfer; the planner's decode-only trace does the same)
    limits = SchedulerLimits(max_running_requests=32, kv_capacity_tokens=10_000, chunked_prefill_tokens=8192,
                             time_scale=0.0, role="decode")
    planned = one_server_trace(batch, OneSecondForwards(), limits.model_limits())
    simulated = await run_sim(batch, limits)
    assert sum(s.retractions for s in planned) > 0
    assert schedule_of(r.seq for r in simulated) == schedule_of(planned)
    assert [len(r.output_ids) for r in simulated] == [o for _, o in batch]
