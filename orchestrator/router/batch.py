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

from orchestrator.records import CUT_OFF_IN_FLIGHT, NEVER_SENT, BenchRequest, RequestResult
from orchestrator.router.dispatch.dispatcher import PDDispatcher
from orchestrator.router.dispatch.failures import DispatchError
from orchestrator.router.dispatch.pairs import Progress, RequestStamps

STOP_DRAIN_S = 1.0  # after a stop: how long the answers the engines already sent may take to be read


async def run_one(dispatcher: PDDispatcher, req: BenchRequest, deadline_at: float | None,
                  queued: bool = False, progress: Progress | None = None) -> RequestResult:
    """One benchmark prompt end to end; never raises, always exactly one RequestResult.

    `queued`: the caller already counted this request as queued in RouterMetrics. `progress`: the caller's
    handle on the request while it runs (its state starts as "queued" iff `queued`).
    """
    body = {
        "input_ids": req.input_ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": req.output_len, "ignore_eos": True},
        "stream": True,
    }
    sent_at = time.time()
    result = RequestResult(index=req.index, status="failed", prompt_len=req.prompt_len,
                           output_len=req.output_len, sent_at=sent_at)
    origin = time.monotonic()  # with sent_at: the legs' monotonic stamps -> sent_at's clock
    stamps = RequestStamps()
    progress = progress or Progress("queued" if queued else None)
    dispatcher.set_progress(progress, "prefill")
    try:
        answer = await dispatcher.generate(body, deadline_at, progress, stamps)
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

    def on_sent_at_clock(t: float | None) -> float | None:
        return None if t is None else sent_at + (t - origin)

    result.prefill_posted_at = on_sent_at_clock(stamps.prefill.posted)
    result.prefill_first_byte_at = on_sent_at_clock(stamps.prefill.first_byte)
    result.decode_posted_at = on_sent_at_clock(stamps.decode.posted)
    result.decode_first_byte_at = on_sent_at_clock(stamps.decode.first_byte)
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
                           stop: asyncio.Event | None = None,
                           stop_drain_s: float = STOP_DRAIN_S) -> AsyncGenerator[list[RequestResult], None]:
    """Yield every request's RequestResult as it completes, at most `max_in_flight` in flight; results done
    within `flush_s` of the first one not yet yielded come together in one list.

    Requests are admitted in the order given. Requests still waiting at the deadline fail at once
    with a "deadline" error, so the lists add up to exactly len(requests) results. Result timings are the
    router's own (sent_at/done_at), so holding a result back for `flush_s` changes none of them.

    Once `stop` is set (the driver was interrupted) every request its engine finished is kept: the decode leg of
    every request in flight is aborted first (so nothing new finishes), then the answers the engines already sent
    are read for up to `stop_drain_s` (a router reading hundreds of streams lags the engines) and the completed
    ones yielded; requests still unanswered are cancelled (both legs aborted). The last list fails every other
    request, telling apart those sent to a pair (CUT_OFF_IN_FLIGHT) from those never sent (NEVER_SENT); the
    driver adds why the batch was stopped.
    """
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight={max_in_flight}: must be >= 1")
    # `max_in_flight` lanes take the next request as each finishes one: no task per request, and no
    # asyncio.wait over every task in flight for each completion (that was O(in flight) per request).
    waiting = iter(requests)
    ready: list[RequestResult] = []
    in_flight: set[Progress] = set()
    taken: dict[int, Progress] = {}  # every request a lane took, by index: whether it was sent
    yielded: set[int] = set()
    wake = asyncio.Event()  # a result is ready, or a lane ended
    if dispatcher.metrics is not None:
        for _ in requests:  # every request not yet sent counts as queued
            dispatcher.metrics.state_change(None, "queued")

    def stopped() -> bool:
        return stop is not None and stop.is_set()

    async def lane() -> None:
        while not stopped() and (req := next(waiting, None)) is not None:
            progress = Progress("queued")
            in_flight.add(progress)
            taken[req.index] = progress
            try:
                result = await run_one(dispatcher, req, deadline_at, queued=True, progress=progress)
            finally:
                in_flight.discard(progress)
            if not progress.stopping or result.status == "ok":
                ready.append(result)  # not ready.append(await ...): that would append to the list of before the await
            wake.set()

    lanes: list[asyncio.Task] = []

    async def open_lanes() -> None:
        # One lane per loop iteration: started together, every lane's first step (pairing, body, a new connection)
        # would run in one iteration before any request's bytes or any engine's answer is handled, so the engines
        # got a 1000-request batch in a step once the last connection was open (docs/router.md, "The opening of a batch").
        for _ in range(min(max_in_flight, len(requests))):
            if stopped():
                return
            t = asyncio.ensure_future(lane())
            t.add_done_callback(lambda _t: wake.set())
            lanes.append(t)
            await asyncio.sleep(0)

    opener = asyncio.ensure_future(open_lanes())
    opener.add_done_callback(lambda _t: wake.set())
    stop_watch = asyncio.ensure_future(stop.wait()) if stop is not None else None
    if stop_watch is not None:
        stop_watch.add_done_callback(lambda _t: wake.set())
    left = len(requests)
    try:
        while left and not stopped():
            await wake.wait()
            wake.clear()
            if stopped():
                break
            if flush_s > 0 and ready and len(ready) < left:
                flush_at = time.monotonic() + flush_s
                while len(ready) < left and (wait_s := flush_at - time.monotonic()) > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait_s):
                            await wake.wait()
                    wake.clear()
            if not ready:
                broken = [e for t in [opener, *lanes] if t.done() and not t.cancelled()
                          and (e := t.exception()) is not None]
                if broken:  # run_one never raises: a bug, not a request's failure
                    raise broken[0]
                continue
            chunk, ready = ready, []
            left -= len(chunk)
            yielded.update(r.index for r in chunk)
            yield chunk
        if stopped():
            for progress in list(in_flight):  # nothing new finishes: abort each decode leg, retry nothing
                progress.stopping = True
                if progress.attempt is not None:
                    dispatcher.abort_in_background(progress.attempt[1].decode, progress.attempt[0])
            drain_until = time.monotonic() + stop_drain_s
            while not all(t.done() for t in [opener, *lanes]) and (wait_s := drain_until - time.monotonic()) > 0:
                if ready:
                    chunk, ready = ready, []
                    yielded.update(r.index for r in chunk)
                    yield chunk
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await wake.wait()
                wake.clear()
            if ready:  # sent before cancelling the rest (which takes a while)
                chunk, ready = ready, []
                yielded.update(r.index for r in chunk)
                yield chunk
    finally:
        opener.cancel()  # first: no lane starts while the others are cancelled
        for t in lanes:  # the consumer (or `stop`) ended the batch early: cancelling aborts their legs
            t.cancel()
        if stop_watch is not None:
            stop_watch.cancel()
        await asyncio.gather(opener, *lanes, return_exceptions=True)
        if dispatcher.metrics is not None:
            for _ in waiting:
                dispatcher.metrics.state_change("queued", None)
    if stopped():  # requests that finished while the others were being cancelled, then every other one failed
        yielded.update(r.index for r in ready)
        ready += [_stopped_result(req, taken.get(req.index)) for req in requests if req.index not in yielded]
        if ready:
            yield ready


def _stopped_result(req: BenchRequest, progress: Progress | None) -> RequestResult:
    """A request of a stopped batch with no result: cut off in flight if an attempt had sent it, else never sent."""
    sent = progress is not None and progress.sent
    return RequestResult(index=req.index, status="failed", prompt_len=req.prompt_len, output_len=req.output_len,
                         error=CUT_OFF_IN_FLIGHT if sent else NEVER_SENT)
