"""The simulated server's prefix cache: a prompt whose prefix the server computed before prefills only the
rest (and faster), LRU beyond capacity, never the whole prompt."""

from __future__ import annotations

import asyncio

from orchestrator.config.model_presets import DEEPSEEK_R1
from orchestrator.engines.prefix_blocks import PrefixBlocks
from orchestrator.engines.sim.scheduler import Scheduler, SchedulerLimits
from orchestrator.engines.sim.sim_request import SimRequest
from orchestrator.perfmodel.costmodel import EngineCostModel
from orchestrator.perfmodel.gpus import GPU_SPECS
from tests.support import make_scheduler


def _hit(cache: PrefixBlocks, ids: list[int]) -> int:
    """Cached leading tokens, as the simulated server's prefill counts them (a hit refreshes the blocks)."""
    return cache.matched_blocks(cache.chain(ids), touch=True) * cache.block_tokens


def test_match_counts_whole_leading_blocks_and_stops_at_the_first_difference():
    cache = PrefixBlocks(block_tokens=16, capacity_blocks=1 << 16)
    cache.insert(cache.chain(list(range(100))))
    assert _hit(cache, list(range(100))) == 96  # 6 whole blocks; the 4-token tail is not a block
    assert _hit(cache, list(range(40)) + [7] * 60) == 32  # the third block differs
    assert _hit(cache, [9] + list(range(1, 100))) == 0  # a prefix cache: a different first token matches nothing


def test_least_recently_used_blocks_go_beyond_capacity():
    cache = PrefixBlocks(block_tokens=16, capacity_blocks=4)
    cache.insert(cache.chain(list(range(64))))
    _hit(cache, list(range(16)))  # touch the first block: now the most recent
    cache.insert(cache.chain(list(range(1000, 1048))))  # 3 new blocks push out 3 old ones, not the touched one
    assert _hit(cache, list(range(16))) == 16
    assert _hit(cache, list(range(1000, 1048))) == 48


def test_a_look_without_a_hit_leaves_the_eviction_order_alone():
    # the router looks a prompt up in every candidate's blocks but sends it to one: only that one's use counts
    cache = PrefixBlocks(block_tokens=16, capacity_blocks=4)
    cache.insert(cache.chain(list(range(64))))
    assert cache.matched_blocks(cache.chain(list(range(16)))) == 1  # looked at, not touched
    cache.insert(cache.chain(list(range(1000, 1016))))  # one new block pushes out the oldest: the first one
    assert cache.matched_blocks(cache.chain(list(range(64)))) == 0


async def test_a_shared_prefix_is_prefilled_once_and_the_second_prompt_is_faster():
    cost = EngineCostModel(DEEPSEEK_R1, GPU_SPECS["H100-SXM"], tp=8)  # real prefill cost, not cpu-fast's floor
    sched = Scheduler(cost, SchedulerLimits(64, 1_000_000, 8192, time_scale=0.01), DEEPSEEK_R1.vocab_size, 1)
    sched.start()
    modelled: list[float] = []  # each prefill batch's modelled seconds, from the real cost model
    prefill_time_s = cost.prefill_time_s
    cost.prefill_time_s = lambda new, cached=None, follows=False: modelled.append(prefill_time_s(new, cached, follows)) or modelled[-1]
    system = list(range(1, 4097))  # 4096 shared tokens, as a long system prompt
    first = SimRequest("a", system + [5, 6, 7], max_new_tokens=1, ignore_eos=True)
    sched.submit(first)
    await asyncio.wait_for(first.finished_event.wait(), 30)
    second = SimRequest("b", system + [8, 9], max_new_tokens=1, ignore_eos=True)
    cold = SimRequest("c", list(range(5000, 9098)), max_new_tokens=1, ignore_eos=True)
    for req in (second, cold):
        sched.submit(req)
        await asyncio.wait_for(req.finished_event.wait(), 30)
    await sched.stop()
    assert (first.cached_tokens, second.cached_tokens, cold.cached_tokens) == (0, 4096, 0)
    first_s, second_s, cold_s = modelled
    assert second_s < cold_s / 3 and cold_s > first_s / 2, modelled  # per-batch overhead stays


async def test_a_prompt_seen_whole_still_computes_its_last_token():
    sched = make_scheduler()
    prompt = list(range(1, 65))
    reqs = [SimRequest(f"r{i}", prompt, max_new_tokens=2, ignore_eos=True) for i in range(2)]
    for r in reqs:
        sched.submit(r)
        await asyncio.wait_for(r.finished_event.wait(), 30)
    await sched.stop()
    assert reqs[1].cached_tokens == 63 and len(reqs[1].output_ids) == 2
