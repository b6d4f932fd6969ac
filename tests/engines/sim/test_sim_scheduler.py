"""The simulated engine's continuous-batching scheduler, on the real cost model's cpu-fast profile."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.config.model_presets import DEEPSEEK_R1
from orchestrator.engines.sim.scheduler import Scheduler, SchedulerLimits
from orchestrator.engines.sim.sim_request import SimRequest, output_token, prompt_seed
from orchestrator.perfmodel.costmodel import EngineCostModel
from orchestrator.perfmodel.gpus import GPU_SPECS
from tests.support import make_scheduler

VOCAB = DEEPSEEK_R1.vocab_size


async def run_all(sched: Scheduler, reqs: list[SimRequest]) -> None:
    for r in reqs:
        sched.submit(r)
    await asyncio.wait_for(asyncio.gather(*(_finished(r) for r in reqs)), 30)
    await sched.stop()


async def _finished(req: SimRequest) -> None:
    await req.finished_event.wait()


async def test_every_request_gets_exactly_its_max_new_tokens():
    sched = make_scheduler()
    reqs = [SimRequest(f"r{i}", list(range(1, 20 + i)), max_new_tokens=1 + i, ignore_eos=True) for i in range(12)]
    await run_all(sched, reqs)
    for i, r in enumerate(reqs):
        assert len(r.output_ids) == 1 + i
        assert r.finish_reason == {"type": "length", "length": 1 + i}
    assert sched.kv_used_tokens == 0


async def test_running_requests_never_exceed_max_running():
    sched = make_scheduler(max_running=3)
    reqs = [SimRequest(f"r{i}", [5, 6, 7], max_new_tokens=8, ignore_eos=True) for i in range(6)]
    await run_all(sched, reqs)
    first_three_done = min(r.finished_at for r in reqs[:3])
    assert all(r.first_token_at >= first_three_done for r in reqs[3:])  # they waited for a free slot


async def test_kv_capacity_holds_back_requests_until_kv_is_freed():
    sched = make_scheduler(kv_tokens=100)
    a = SimRequest("a", list(range(50)), max_new_tokens=10, ignore_eos=True)  # holds 60 of 100 tokens
    b = SimRequest("b", list(range(50)), max_new_tokens=10, ignore_eos=True)
    await run_all(sched, [a, b])
    assert b.first_token_at >= a.finished_at


async def test_long_prompt_is_prefilled_in_chunks_of_the_token_budget():
    sched = make_scheduler(chunk=1000)
    req = SimRequest("long", list(range(2500)), max_new_tokens=4, ignore_eos=True)
    await run_all(sched, [req])
    assert sched.prefill_batches == 3  # 1000 + 1000 + 500
    assert sched.decode_steps == 3  # first token comes from the prefill


async def test_outputs_depend_only_on_prompt_and_position():
    prompt = [101, 202, 303, 404]
    one = SimRequest("x", prompt, max_new_tokens=6, ignore_eos=True)
    await run_all(make_scheduler(chunk=2), [one])  # chunked, small batches
    crowd = [SimRequest(f"y{i}", prompt if i == 3 else [i, i + 1], max_new_tokens=6, ignore_eos=True)
             for i in range(5)]
    await run_all(make_scheduler(), crowd)
    assert one.output_ids == crowd[3].output_ids
    assert one.output_ids == [output_token(prompt_seed(prompt), i, VOCAB) for i in range(6)]


async def test_pd_decode_request_continues_from_the_prefills_first_token():
    prompt = [9, 8, 7, 6]
    reference = SimRequest("ref", prompt, max_new_tokens=5, ignore_eos=True)
    await run_all(make_scheduler(), [reference])
    sched = make_scheduler(role="decode")
    decode = SimRequest("d", prompt, max_new_tokens=5, ignore_eos=True)
    await asyncio.wait_for(sched.preallocate(decode), 5)
    assert sched.kv_used_tokens == len(prompt)  # SGLang pre-allocates the prompt's KV before the transfer
    decode.first_token = reference.output_ids[0]
    await run_all(sched, [decode])
    assert decode.output_ids == reference.output_ids
    assert sched.prefill_batches == 0 and sched.kv_used_tokens == 0


async def test_eos_stops_generation_unless_ignore_eos():
    sched = make_scheduler(vocab=3, eos=1)  # tiny vocabulary: EOS comes up within a few tokens
    stops = SimRequest("s", [2, 2], max_new_tokens=200)
    runs_on = SimRequest("i", [2, 2], max_new_tokens=200, ignore_eos=True)
    await run_all(sched, [stops, runs_on])
    assert stops.finish_reason == {"type": "stop", "matched": 1} and stops.output_ids[-1] == 1
    assert len(stops.output_ids) < 200 and len(runs_on.output_ids) == 200


async def test_abort_matches_rid_prefix_and_frees_kv():
    sched = make_scheduler()
    keep = SimRequest("keep-1", [1, 2], max_new_tokens=5, ignore_eos=True)
    doomed = [SimRequest(f"job7-{i}", [1, 2, 3], max_new_tokens=10_000_000, ignore_eos=True) for i in range(3)]
    for r in [keep, *doomed]:
        sched.submit(r)
    await asyncio.wait_for(_finished(keep), 30)
    assert sched.abort("job7") == 3
    await sched.stop()
    assert all(r.finish_reason["type"] == "abort" for r in doomed)
    assert sched.kv_used_tokens == 0 and sched.idle()


async def test_max_new_tokens_is_clamped_to_the_kv_pool():
    sched = make_scheduler(kv_tokens=50)
    req = SimRequest("big", list(range(40)), max_new_tokens=1000, ignore_eos=True)
    await run_all(sched, [req])
    assert len(req.output_ids) == 8  # admitted only while prompt + max_new_tokens + a page < the 50 free slots


def test_a_pool_without_kv_room_is_refused_with_the_fix():
    cost = EngineCostModel(DEEPSEEK_R1, GPU_SPECS["cpu-fast"])
    with pytest.raises(ValueError, match="no GPU memory for KV cache"):
        Scheduler(cost, SchedulerLimits(8, 0, 8192), VOCAB, 1)


async def test_abort_reaches_a_request_inside_the_running_prefill_batch():
    cost = EngineCostModel(DEEPSEEK_R1, GPU_SPECS["cpu-fast"], tp=8)
    sched = Scheduler(cost, SchedulerLimits(64, 1_000_000, 8192, time_scale=1000.0), VOCAB, 1)  # slow prefill
    sched.start()
    req = SimRequest("in-batch", list(range(100)), max_new_tokens=5)
    sched.submit(req)
    for _ in range(1000):  # poll until the loop picked it up and sleeps through its prefill
        if sched.prefilling:
            break
        await asyncio.sleep(0.01)
    assert sched.abort("in-") == 1
    await asyncio.wait_for(req.finished_event.wait(), 5)
    await sched.stop()
    assert req.aborted and req.output_ids == [] and sched.kv_used_tokens == 0


async def test_slow_factor_stretches_every_step():
    cost = EngineCostModel(DEEPSEEK_R1, GPU_SPECS["cpu-fast"], tp=8)
    limits = SchedulerLimits(64, 1_000_000, 8192, time_scale=0.01)
    slow = Scheduler(cost, limits, VOCAB, 1, slow_factor=lambda: 100_000.0)
    normal = Scheduler(cost, limits, VOCAB, 1)
    reqs = {}
    for name, sched in (("slow", slow), ("normal", normal)):
        sched.start()
        reqs[name] = SimRequest(name, [1, 2, 3], max_new_tokens=20, ignore_eos=True)
        sched.submit(reqs[name])
    await asyncio.wait_for(reqs["normal"].finished_event.wait(), 30)
    assert len(reqs["slow"].output_ids) < 20  # same work, started together, still far from done
    await slow.stop()
    await normal.stop()


class _OldSignatureCostModel:
    """The bug that once hung test_sim_pacing: a cost model whose prefill_time_s lacks the step loop's chunk_follows
    argument, so the scheduler's first prefill step raises TypeError after the model took the request off its queue."""

    def prefill_time_s(self, new_tokens, cached_tokens=None) -> float:
        return 0.001

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        return 0.001


async def test_a_scheduler_step_that_raises_fails_every_request_with_the_cause_instead_of_hanging():
    sched = Scheduler(_OldSignatureCostModel(), SchedulerLimits(8, 100_000, 8192), VOCAB, eos_token_id=-1)
    sched.start()
    in_flight = SimRequest("in-flight", [1, 2, 3], max_new_tokens=5, ignore_eos=True)
    sched.submit(in_flight)
    await asyncio.wait_for(in_flight.finished_event.wait(), 5)  # before the fix: never set (the test hung)
    cause = "simulated scheduler failed: TypeError: _OldSignatureCostModel.prefill_time_s() takes"
    assert in_flight.aborted and in_flight.finish_reason["message"].startswith(cause)
    assert sched.failure is not None and sched.failure.startswith(cause)
    later = SimRequest("later", [4, 5], max_new_tokens=5)
    sched.submit(later)
    transferred = SimRequest("transferred", [6, 7], max_new_tokens=5)
    await asyncio.wait_for(sched.preallocate(transferred), 5)  # (PD decode) one waiting for KV room ends too
    for req in (later, transferred):
        assert req.finish_reason == {"type": "abort", "message": sched.failure, "status_code": 500}
    assert sched._task is not None and sched._task.done()  # the loop stopped, not spinning on the same error
    await sched.stop()


async def test_a_pd_decode_prompt_whose_kv_and_reserve_exceed_the_pool_ends_with_the_reason_instead_of_waiting():
    """The pre-allocation needs prompt + 512 reserved decode tokens free at once: a 600-token prompt on a 1,000-token
    pool never got it and waited forever; 488 tokens (488 + 512 = 1,000) is pre-allocated."""
    sched = make_scheduler(kv_tokens=1000, role="decode")
    fits = SimRequest("fits", list(range(1, 489)), max_new_tokens=4, ignore_eos=True)
    await asyncio.wait_for(sched.preallocate(fits), 5)
    assert not fits.finished and sched.kv_used_tokens == 488
    sched.drop(fits)
    never, local = (SimRequest(rid, list(range(1, 601)), max_new_tokens=4) for rid in ("never", "local"))
    await asyncio.wait_for(sched.preallocate(never), 5)  # before the fix: never returned
    sched.submit(local)  # a local request (SGLang's fake transfer) is pre-allocated the same way
    await asyncio.wait_for(local.finished_event.wait(), 5)
    why = ("The input (600 tokens) + 512 reserved decode tokens (--num-reserved-decode-tokens) = 1112 tokens exceeds "
           "the decode's KV pool (1000 tokens): its KV can never be pre-allocated.")
    for req in (never, local):
        assert req.aborted and req.finish_reason["message"].startswith(why) and req.finish_reason["status_code"] == 400
    assert sched.never_preallocated(488) is None and sched.kv_used_tokens == 0
    await sched.stop()
