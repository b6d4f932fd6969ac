"""PDDispatcher: one request sent the SGLang PD way (see the package docstring), with bounded retries on another pair
before the deadline: a whole answer (generate) or an open decode stream for StreamRelay (open_stream)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import AsyncGenerator

import aiohttp

from orchestrator.router.dispatch.attempt import PairAttempts
from orchestrator.router.dispatch.failures import LegFailure, RetryState, final_error, http_failure
from orchestrator.router.dispatch.engine_client import LegStamps
from orchestrator.router.dispatch.pairs import Answer, Pair, Progress, RequestStamps, request_shape
from orchestrator.router.dispatch.policies import NoWorkerError, RequestShape
from orchestrator.router.dispatch.relay import StreamRelay

log = logging.getLogger(__name__)

JSON_HEADERS = {"Content-Type": "application/json"}


class PDDispatcher(PairAttempts):
    """Pairs and sends requests to the current worker set; one instance per router replica."""

    async def generate(self, body: dict, deadline_at: float | None = None, progress: Progress | None = None,
                       stamps: RequestStamps | None = None) -> Answer:
        """Send one /generate body (stream or not) with retries; the decode's answer, or DispatchError.
        `stamps` (the caller's, so a failure keeps them) gets the legs' times of each attempt, the last one's kept."""
        sent_at, origin = time.time(), time.monotonic()
        state = RetryState()
        async with contextlib.aclosing(self._attempts(deadline_at, state, request_shape(body))) as attempts:
            async for attempt, pair, _ in attempts:
                if progress is not None and progress.stopping:
                    break
                if stamps is not None:
                    stamps.prefill, stamps.decode = LegStamps(), LegStamps()
                answer = Answer(status=0, payload=None, pair=pair, rid=self._new_rid(), attempts=attempt,
                                sent_at=sent_at, origin=origin, progress=progress, stamps=stamps)
                try:
                    await self._attempt(body, pair, self._leg_timeout_s(deadline_at), answer)
                    return answer
                except LegFailure as exc:
                    state.last = exc
                    log.info("attempt %d of %s failed: %s", attempt, answer.rid, exc)
                    if not exc.retryable or (progress is not None and progress.stopping):
                        break
        raise final_error(state.last, state.attempts, deadline_at)

    async def open_stream(self, body: dict, deadline_at: float | None = None) -> StreamRelay:
        """Start a streamed request; returns once the decode answered its headers (retrying before that)."""
        state = RetryState()
        async with contextlib.aclosing(self._attempts(deadline_at, state, request_shape(body))) as attempts:
            async for attempt, pair, timeout_s in attempts:
                try:
                    return await self._open_stream_once(body, pair, timeout_s, attempt)
                except LegFailure as exc:
                    state.last = exc
                    if not exc.retryable:
                        break
        raise final_error(state.last, state.attempts, deadline_at)

    async def _attempts(
        self, deadline_at: float | None, state: RetryState, request: RequestShape | None = None
    ) -> AsyncGenerator[tuple[int, Pair, float], None]:
        """(attempt, pair, leg timeout) for each try: bounded count, backoff, time left before the deadline.

        An attempt with no worker to pick is skipped (its error kept in `state`); the caller records leg
        failures in `state.last` and stops early on a non-retryable one.
        """
        for attempt in range(1, self.settings.max_attempts + 1):
            timeout_s = self._leg_timeout_s(deadline_at)
            if timeout_s <= 0:
                return
            if attempt > 1:
                await asyncio.sleep(min(self.settings.backoff_s * 2 ** (attempt - 2), timeout_s))
            try:
                pair = self.pick_pair(request)
            except NoWorkerError as exc:
                state.last = exc
                continue
            state.attempts = attempt
            yield attempt, pair, timeout_s

    async def _open_stream_once(self, body: dict, pair: Pair, timeout_s: float, attempt: int) -> StreamRelay:
        rid = self._new_rid()
        sent_at = time.monotonic()
        deadline = sent_at + timeout_s
        sent, prefill_task = self._start_legs(body, pair, rid, timeout_s)
        w = pair.decode
        self.leg_start(w, pair.decode_tokens)
        resp = None
        try:
            try:
                async with asyncio.timeout(timeout_s):
                    resp = await self.session.post(w.endpoint.url + "/generate", data=sent, headers=JSON_HEADERS)
            except TimeoutError:
                raise LegFailure("timeout", "decode", w.name, f"no answer within {timeout_s:.1f}s", True, 504) from None
            except aiohttp.ClientError as exc:
                raise LegFailure("connect", "decode", w.name, repr(exc), True, 502) from None
            if resp.status != 200:
                raise http_failure("decode", w, resp.status, await resp.read())
        except BaseException as exc:
            self.leg_done(w, pair.decode_tokens)
            if resp is not None:
                resp.release()
            await self._attempt_failed(exc, pair, rid, prefill_task, None)
            raise
        return StreamRelay(self, resp, pair, rid, prefill_task, deadline, attempt, sent_at)
