"""The router's batch driver: a benchmark batch -> PDDispatcher.generate per prompt, `max_in_flight` at a time.

`run_batch(dispatcher, requests, max_in_flight, deadline_at)` yields one RequestResult per prompt as each
finishes (PDRouter.generate_batch streams them to the bench driver); `run_one` never raises.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

from orchestrator.records import BenchRequest, RequestResult
from orchestrator.router.dispatch import PDDispatcher
from orchestrator.router.failures import DispatchError
from orchestrator.router.pairs import Progress


async def run_one(dispatcher: PDDispatcher, req: BenchRequest, deadline_at: float | None,
                  queued: bool = False) -> RequestResult:
    """One benchmark prompt end to end; never raises, always exactly one RequestResult.

    `queued`: the caller already counted this request as queued in RouterMetrics.
    """
    body = {
        "input_ids": req.input_ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": req.output_len, "ignore_eos": True},
        "stream": True,
    }
    result = RequestResult(index=req.index, status="failed", prompt_len=req.prompt_len,
                           output_len=req.output_len, sent_at=time.time())
    progress = Progress("queued" if queued else None)
    dispatcher.set_progress(progress, "prefill")
    try:
        answer = await dispatcher.generate(body, deadline_at, progress)
    except DispatchError as exc:
        result.error = str(exc)
        result.attempts = max(exc.attempts, 1)
    else:
        result.status = "ok"
        result.completion_tokens = answer.completion_tokens
        result.ttft_s, result.kv_wait_s, result.e2e_s = answer.ttft_s, answer.kv_wait_s, answer.e2e_s
        result.attempts = answer.attempts
        result.output_ids = answer.output_ids
        if answer.pair.prefill is not None:
            result.prefill_worker = answer.pair.prefill.name
        result.decode_worker = answer.pair.decode.name
    finally:
        dispatcher.set_progress(progress, None)
    result.done_at = time.time()
    if dispatcher.metrics is not None:
        dispatcher.metrics.completed(result)
    return result

async def run_batch(dispatcher: PDDispatcher, requests: list[BenchRequest], max_in_flight: int,
                    deadline_at: float | None = None) -> AsyncIterator[RequestResult]:
    """Yield one RequestResult per request as each completes; at most `max_in_flight` in flight.

    Requests are admitted in the order given. Requests still waiting at the deadline fail at once
    with a "deadline" error, so the iterator always ends with exactly len(requests) results.
    """
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight={max_in_flight}: must be >= 1")
    waiting = iter(requests)
    running: set[asyncio.Task] = set()
    if dispatcher.metrics is not None:
        for _ in requests:  # every request not yet sent counts as queued
            dispatcher.metrics.state_change(None, "queued")

    def admit() -> None:
        while len(running) < max_in_flight:
            req = next(waiting, None)
            if req is None:
                return
            running.add(asyncio.ensure_future(run_one(dispatcher, req, deadline_at, queued=True)))

    admit()
    try:
        while running:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            running.difference_update(done)
            admit()
            for t in done:
                yield t.result()
    finally:
        for t in running:  # the consumer stopped early: cancelling aborts their legs on the servers
            t.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        if dispatcher.metrics is not None:
            for _ in waiting:
                dispatcher.metrics.state_change("queued", None)
