"""The simulated scheduler keeps the model's time: CPU spent between steps is absorbed, a stalled host is counted."""

from __future__ import annotations

import asyncio
import time

from orchestrator.engines.sim.scheduler import MAX_CATCH_UP_S, Scheduler, SchedulerLimits, SimRequest

STEP_S = 0.02


class FixedSteps:
    """A cost model whose every forward takes STEP_S (keeps the arithmetic of the test exact)."""

    def prefill_time_s(self, new_tokens, cached_tokens=None) -> float:
        return STEP_S

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        return STEP_S


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def consume(req: SimRequest, cpu_per_token_s: float, stall_at: int | None = None, stall_s: float = 0.0) -> None:
    """A streaming client in the server's own event loop: CPU work for every token it is woken for."""
    seen = 0
    while not req.finished:
        await req.updated.wait()
        req.updated.clear()
        if len(req.output_ids) > seen:
            seen = len(req.output_ids)
            busy(cpu_per_token_s)
            if stall_at is not None and seen >= stall_at:
                busy(stall_s)
                stall_at = None


async def run(tokens: int, cpu_per_token_s: float, stall_at: int | None = None, stall_s: float = 0.0):
    sched = Scheduler(FixedSteps(), SchedulerLimits(8, 100_000, 8192), vocab_size=1000, eos_token_id=-1)
    sched.start()
    req = SimRequest("r", [1, 2, 3], max_new_tokens=tokens, ignore_eos=True)
    started = time.monotonic()
    sched.submit(req)
    await asyncio.wait_for(consume(req, cpu_per_token_s, stall_at, stall_s), 60)
    wall = time.monotonic() - started
    stats = sched.stats()
    await sched.stop()
    return wall, stats


async def test_cpu_between_steps_does_not_stretch_the_modelled_time():
    # 1 prefill + 59 decode steps of 20 ms = 1.2 s modelled; 12 ms of CPU per token would make it ~1.9 s
    # if every step slept its modelled time after that work
    wall, stats = await run(60, cpu_per_token_s=0.012)
    modelled = 60 * STEP_S
    assert abs(stats.modelled_busy_s - modelled) < 1e-9
    assert wall < modelled * 1.15, wall
    assert stats.host_lost_s == 0.0


async def test_a_stalled_host_catches_up_a_little_and_counts_the_rest():
    # 200 steps of 20 ms = 4 s modelled; the host stalls 2.5 s after 10 of them: 2 s of that are caught up by
    # running the owed steps back to back, 0.5 s is lost for good
    stall = MAX_CATCH_UP_S + 0.5
    wall, stats = await run(200, cpu_per_token_s=0.0, stall_at=10, stall_s=stall)
    assert stats.max_late_s >= stall - 0.05
    assert abs(stats.host_lost_s - 0.5) < 0.15, stats.host_lost_s
    # what the model took, plus what the host lost: nothing else
    assert abs(wall - (200 * STEP_S + stats.host_lost_s)) < 0.25, (wall, stats)
