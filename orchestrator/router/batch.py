"""The router's batch driver: a benchmark batch -> PDDispatcher.generate per prompt, `max_in_flight` at a time.

`run_batch_chunks(dispatcher, requests, max_in_flight, deadline_at, flush_s)` yields the results that
finished within `flush_s` of each other as one list (PDRouter.generate_batch_chunks streams one Serve item
per list: a Serve item costs ~0.3 ms of CPU on each side); `run_batch` yields them one by one;
`run_one` never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncGenerator, AsyncIterator

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
    """`run_batch_chunks` one result at a time, each as soon as it is done."""
    async with contextlib.aclosing(run_batch_chunks(dispatcher, requests, max_in_flight, deadline_at)) as chunks:
        async for chunk in chunks:
            for result in chunk:
                yield result


async def run_batch_chunks(dispatcher: PDDispatcher, requests: list[BenchRequest], max_in_flight: int,
                           deadline_at: float | None = None, flush_s: float = 0.0,
                           stop: asyncio.Event | None = None) -> AsyncGenerator[list[RequestResult], None]:
    """Yield every request's RequestResult as it completes, at most `max_in_flight` in flight; results done
    within `flush_s` of the first one not yet yielded come together in one list.

    Requests are admitted in the order given. Requests still waiting at the deadline fail at once
    with a "deadline" error, so the lists add up to exactly len(requests) results. Result timings are the
    router's own (sent_at/done_at), so holding a result back for `flush_s` changes none of them.
    Once `stop` is set (the driver was interrupted), the requests in flight are cancelled (their legs
    aborted on the servers), the results finished by then are yielded, and the lists end short.
    """
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight={max_in_flight}: must be >= 1")
    # `max_in_flight` lanes take the next request as each finishes one: no task per request, and no
    # asyncio.wait over every task in flight for each completion (that was O(in flight) per request).
    waiting = iter(requests)
    ready: list[RequestResult] = []
    wake = asyncio.Event()  # a result is ready, or a lane ended
    if dispatcher.metrics is not None:
        for _ in requests:  # every request not yet sent counts as queued
            dispatcher.metrics.state_change(None, "queued")

    async def lane() -> None:
        for req in waiting:
            result = await run_one(dispatcher, req, deadline_at, queued=True)
            ready.append(result)  # not ready.append(await ...): that would append to the list of before the await
            wake.set()

    def stopped() -> bool:
        return stop is not None and stop.is_set()

    lanes = [asyncio.ensure_future(lane()) for _ in range(min(max_in_flight, len(requests)))]
    for t in lanes:
        t.add_done_callback(lambda _t: wake.set())
    stop_watch = asyncio.ensure_future(stop.wait()) if stop is not None else None
    if stop_watch is not None:
        stop_watch.add_done_callback(lambda _t: wake.set())
    left = len(requests)
    try:
        while left and not stopped():
            await wake.wait()
            wake.clear()
            if stopped():
                break  # what is ready goes out first (below), before the lanes are cancelled
            if flush_s > 0 and ready and len(ready) < left:
                flush_at = time.monotonic() + flush_s
                while len(ready) < left and (wait_s := flush_at - time.monotonic()) > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait_s):
                            await wake.wait()
                    wake.clear()
            if not ready:
                broken = [e for t in lanes if t.done() and not t.cancelled() and (e := t.exception()) is not None]
                if broken:  # run_one never raises: a bug, not a request's failure
                    raise broken[0]
                continue
            chunk, ready = ready, []
            left -= len(chunk)
            yield chunk
        if ready:  # stopped: the results finished by now, sent before cancelling the rest (which takes a while)
            chunk, ready = ready, []
            yield chunk
    finally:
        for t in lanes:  # the consumer (or `stop`) ended the batch early: cancelling aborts their legs
            t.cancel()
        if stop_watch is not None:
            stop_watch.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
        if dispatcher.metrics is not None:
            for _ in waiting:
                dispatcher.metrics.state_change("queued", None)
    if ready:  # stopped: requests that finished while the others were being cancelled
        yield ready
