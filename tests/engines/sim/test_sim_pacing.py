"""The simulated scheduler keeps the model's time: CPU spent between steps is absorbed, a stalled host is counted.

Runs on a virtual clock (an event loop whose time only moves when it would otherwise wait, or when the test
spends "CPU"), so the arithmetic is exact and a loaded machine cannot make it flake.
"""

from __future__ import annotations

import asyncio
import selectors
from types import SimpleNamespace

import pytest

from orchestrator.engines.sim import scheduler as scheduler_module
from orchestrator.engines.sim.scheduler import MAX_CATCH_UP_S, Scheduler, SchedulerLimits
from orchestrator.engines.sim.sim_request import SimRequest

STEP_S = 0.02


class FixedSteps:
    """A cost model whose every forward takes STEP_S (keeps the arithmetic of the test exact); it can also spend
    `cpu_s` of the server's own CPU before each step (the work a real server does between steps)."""

    def __init__(self, loop: "VirtualClockLoop | None" = None, cpu_s: float = 0.0):
        self.loop, self.cpu_s = loop, cpu_s

    def _step(self) -> float:
        if self.loop is not None:
            self.loop.spend_cpu(self.cpu_s)
        return STEP_S

    def prefill_time_s(self, new_tokens, cached_tokens=None, chunk_follows=False) -> float:
        return self._step()

    def decode_step_s(self, batch_size: int, context_tokens: int, greedy_chains=None) -> float:
        return self._step()


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time: instead of waiting `timeout` for I/O, it moves its clock by `timeout`."""

    def __init__(self) -> None:
        super().__init__(selectors.DefaultSelector())
        self.now = 1000.0
        poll = self._selector.select

        def select(timeout: float | None = None):
            events = poll(0)
            if not events and timeout:
                self.now += timeout
            return events

        self._selector.select = select  # type: ignore[method-assign]  # the one hook asyncio offers for waiting

    def time(self) -> float:
        return self.now

    def spend_cpu(self, seconds: float) -> None:
        """Work that holds the loop (a client's per-token CPU, a stalled host): time passes, nothing else runs."""
        self.now += seconds


@pytest.fixture
def loop(monkeypatch) -> VirtualClockLoop:
    loop = VirtualClockLoop()
    monkeypatch.setattr(scheduler_module, "time", SimpleNamespace(monotonic=loop.time))
    yield loop
    loop.close()


async def consume(loop: VirtualClockLoop, req: SimRequest, cpu_per_token_s: float, stall_at: int | None = None,
                  stall_s: float = 0.0) -> None:
    """A streaming client in the server's own event loop: CPU work for every token it is woken for."""
    seen = 0
    while not req.finished:
        await req.updated.wait()
        req.updated.clear()
        if len(req.output_ids) > seen:
            seen = len(req.output_ids)
            loop.spend_cpu(cpu_per_token_s)
            if stall_at is not None and seen >= stall_at:
                loop.spend_cpu(stall_s)
                stall_at = None


def run(loop: VirtualClockLoop, tokens: int, cpu_per_token_s: float, stall_at: int | None = None,
        stall_s: float = 0.0, server_cpu_per_step_s: float = 0.0):
    async def main():
        sched = Scheduler(FixedSteps(loop, server_cpu_per_step_s), SchedulerLimits(8, 100_000, 8192), vocab_size=1000, eos_token_id=-1)
        sched.start()
        req = SimRequest("r", [1, 2, 3], max_new_tokens=tokens, ignore_eos=True)
        started = loop.time()
        sched.submit(req)
        await consume(loop, req, cpu_per_token_s, stall_at, stall_s)
        wall = loop.time() - started
        stats = sched.stats()
        await sched.stop()
        return wall, stats

    return loop.run_until_complete(main())


def test_cpu_between_steps_does_not_stretch_the_modelled_time(loop):
    # 1 prefill + 59 decode steps of 20 ms = 1.2 s modelled; 12 ms of the server's CPU before every step would
    # make it 1.92 s if every step slept its modelled time after that work, and the client's 5 ms per token run
    # while the next step is under way
    wall, stats = run(loop, 60, cpu_per_token_s=0.005, server_cpu_per_step_s=0.012)
    modelled = 60 * STEP_S
    assert stats.modelled_busy_s == pytest.approx(modelled, abs=1e-9)
    assert stats.host_lost_s == 0.0
    # only the first step's CPU (before the timeline starts) and the last token's client work are not hidden
    assert wall == pytest.approx(0.012 + modelled + 0.005, abs=1e-6)


def test_cpu_longer_than_a_step_sets_the_pace(loop):
    """Above the step time the client, not the model, sets the pace: each step starts when the client is back."""
    wall, stats = run(loop, 60, cpu_per_token_s=0.03)
    assert stats.modelled_busy_s == pytest.approx(60 * STEP_S, abs=1e-9)
    assert wall == pytest.approx(STEP_S + 60 * 0.03, abs=1e-6)


def test_a_stalled_host_catches_up_a_little_and_counts_the_rest(loop):
    # 200 steps of 20 ms = 4 s modelled; the host stalls 2.5 s after token 10, while the step of token 11 is
    # under way: that step's 20 ms are the model's, the host is 2.48 s late; 2 s of that are caught up by running
    # the owed steps back to back, 0.48 s is lost for good
    stall = MAX_CATCH_UP_S + 0.5
    wall, stats = run(loop, 200, cpu_per_token_s=0.0, stall_at=10, stall_s=stall)
    assert stats.max_late_s == pytest.approx(stall - STEP_S, abs=1e-6)
    assert stats.host_lost_s == pytest.approx(stall - STEP_S - MAX_CATCH_UP_S, abs=1e-6)
    # what the model took, plus what the host lost: nothing else
    assert stats.modelled_busy_s == pytest.approx(200 * STEP_S, abs=1e-9)
    assert wall == pytest.approx(200 * STEP_S + stats.host_lost_s, abs=1e-6)
