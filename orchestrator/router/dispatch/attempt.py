"""One attempt of a request (PairAttempts): a fresh rid and bootstrap rooms, the same body to the prefill and the
decode leg at once, each leg under the time left, and on any failure both legs aborted and the workers to blame
marked suspect."""

from __future__ import annotations

import asyncio
import time

import orjson

from orchestrator.router.dispatch.connections import EngineConnections
from orchestrator.router.dispatch.engine_client import EngineConnectionError, LegStamps
from orchestrator.router.dispatch.failures import LegFailure, http_failure, raise_if_stream_aborted
from orchestrator.router.dispatch.pairs import Answer, Pair, Progress, batch_size, fill_from_payload, with_pairing
from orchestrator.router.dispatch.policies import WorkerState
from orchestrator.router.dispatch.relay import answer_from_stream
from orchestrator.router.dispatch.settings import DEFAULT_REQUEST_TIMEOUT_S
from orchestrator.router.json_response import json_bytes


class PairAttempts(EngineConnections):
    """Both legs of one attempt, and what an attempt that failed leaves behind."""

    def _new_rid(self) -> str:
        # 32 hex digits like uuid4().hex (fixed width: batched items append a suffix), at a third of its cost
        return f"{self._rng.getrandbits(128):032x}"

    def _new_room(self) -> int:
        # Random 63-bit, never 0 (0 means "no metadata yet" to the decode); unique while in flight.
        # With prefill dp>1 SGLang maps room % dp to a DP rank: random rooms spread evenly.
        while True:
            room = self._rng.getrandbits(63)
            if room and room not in self._rooms_in_flight:
                return room

    def _leg_timeout_s(self, deadline_at: float | None) -> float:
        """Seconds each leg may take: the configured timeout, capped by the time left to the deadline."""
        limits = []
        if self.settings.request_timeout_s is not None:
            limits.append(self.settings.request_timeout_s)
        if deadline_at is not None:
            limits.append(deadline_at - time.time())
        return min(limits) if limits else DEFAULT_REQUEST_TIMEOUT_S

    async def _prefill_leg(self, w: WorkerState, body: bytes, stream: bool, tokens: int, timeout_s: float,
                           stamps: LegStamps | None = None) -> float:
        """Post to the prefill and wait for its answer (sent after the KV transfer); return monotonic time."""
        self.leg_start(w, tokens)
        try:
            async with asyncio.timeout(timeout_s):
                r = await self.engine_client.post(w.endpoint.url, "/generate", body, stamps=stamps)
            if r.status != 200:
                raise http_failure("prefill", w, r.status, r.body)
            if stream:
                raise_if_stream_aborted("prefill", w, r.body)
            return time.monotonic()
        except TimeoutError:
            raise LegFailure("timeout", "prefill", w.name, f"no answer within {timeout_s:.1f}s", True, 504) from None
        except EngineConnectionError as exc:
            raise LegFailure("connect", "prefill", w.name, str(exc), True, 502) from None
        finally:
            self.leg_done(w, tokens)

    async def _decode_leg(self, w: WorkerState, body: bytes, stream: bool, tokens: int, timeout_s: float,
                          t0: float, answer: Answer) -> None:
        """Post to the decode and read its whole answer (JSON, or an SSE stream: TTFT at its first bytes)."""
        self.leg_start(w, tokens)
        on_first_body = (lambda: self.set_progress(answer.progress, "decoding")) if stream else None
        try:
            async with asyncio.timeout(timeout_s):
                r = await self.engine_client.post(w.endpoint.url, "/generate", body, on_first_body,
                                                  answer.stamps.decode if answer.stamps is not None else None)
            if r.status != 200:
                raise http_failure("decode", w, r.status, r.body)
            if stream:
                answer_from_stream(w, r.body, answer)
                answer.ttft_s = r.first_body_at - t0 if r.first_body_at is not None else None
            else:
                answer.payload = orjson.loads(r.body)
                fill_from_payload(answer, answer.payload)
            answer.status = r.status
            answer.e2e_s = time.monotonic() - t0
        except TimeoutError:
            raise LegFailure("timeout", "decode", w.name, f"no answer within {timeout_s:.1f}s", True, 504) from None
        except EngineConnectionError as exc:
            raise LegFailure("connect", "decode", w.name, str(exc), True, 502) from None
        except orjson.JSONDecodeError as exc:
            raise LegFailure("bad_json", "decode", w.name, f"answer is not JSON: {exc}", True, 502) from None
        finally:
            self.leg_done(w, tokens)

    def _start_legs(self, body: dict, pair: Pair, rid: str, timeout_s: float,
                    stamps: LegStamps | None = None) -> tuple[bytes, asyncio.Task | None]:
        """One attempt's body (explicit rid, fresh rooms) and its prefill leg (its times into `stamps`), started;
        the caller runs the decode leg. The rooms stay reserved until the prefill leg (the KV sender) has ended."""
        rooms = [self._new_room() for _ in range(batch_size(body) or 1)] if pair.prefill is not None else []
        sent = json_bytes(with_pairing(body, pair, rid, rooms))  # once: the same bytes go to both legs
        if pair.prefill is None:
            return sent, None
        self._rooms_in_flight.update(rooms)
        prefill_task = asyncio.ensure_future(
            self._prefill_leg(pair.prefill, sent, bool(body.get("stream")), pair.prefill_tokens, timeout_s, stamps))
        prefill_task.add_done_callback(lambda _t: self._rooms_in_flight.difference_update(rooms))
        return sent, prefill_task

    async def _attempt_failed(self, exc: BaseException, pair: Pair, rid: str, prefill_task: asyncio.Task | None,
                              progress: Progress | None) -> None:
        """An attempt failed (or was cancelled) before its answer: end the prefill leg, abort both legs
        (same rid; not the decode a batch stop already aborted), keep the workers to blame out for a while."""
        if prefill_task is not None:
            prefill_task.cancel()
            await asyncio.gather(prefill_task, return_exceptions=True)
        self.set_progress(progress, "prefill")  # a retry starts over
        stopping = progress is not None and progress.stopping
        for w in (pair.prefill, None if stopping else pair.decode):
            if w is not None:
                self.abort_in_background(w, rid)
        if isinstance(exc, LegFailure):
            if exc.kind == "timeout":  # a stalled exchange implicates every leg still waiting
                for w in (pair.prefill, pair.decode):
                    if w is not None:
                        self.mark_suspect(w)
            elif exc.retryable:
                self.mark_suspect(self.workers.get(exc.worker) or pair.decode)

    async def _attempt(self, body: dict, pair: Pair, timeout_s: float, answer: Answer) -> None:
        """Both legs of one attempt, concurrently; on any failure abort both and raise LegFailure."""
        rid = answer.rid
        t0 = time.monotonic()
        # TTFT and e2e count from the request's first send (retries included); kv_wait is this attempt's.
        # The decode leg runs in this task, the prefill leg beside it; a prefill that fails while the
        # decode waits cancels this task (its decode leg would wait for KV that never comes).
        me, cut = asyncio.current_task(), [False, False]  # [decoding, cut by the prefill]
        assert me is not None, "an attempt runs in its request's task"
        if answer.progress is not None:
            answer.progress.attempt = (rid, pair)
            answer.progress.sent = True
        sent, prefill_task = self._start_legs(body, pair, rid, timeout_s,
                                              answer.stamps.prefill if answer.stamps is not None else None)
        if prefill_task is not None:

            def on_prefill_done(t: asyncio.Future) -> None:
                if cut[0] and not t.cancelled() and t.exception() is not None:
                    cut[1] = True
                    me.cancel()

            prefill_task.add_done_callback(on_prefill_done)
        try:
            cut[0] = True
            try:
                await self._decode_leg(pair.decode, sent, bool(body.get("stream")), pair.decode_tokens, timeout_s,
                                       answer.origin, answer)
            except asyncio.CancelledError:
                if not cut[1] or me.uncancel() > 0:
                    raise  # cancelled from outside (too)
                failure = prefill_task.exception() if prefill_task is not None else None
                assert failure is not None, "only a failed prefill leg cuts the decode"
                raise failure from None
            finally:
                cut[0] = False
            if prefill_task is not None:
                # Once the decode has answered, the prefill leg only adds kv_wait: do not let a
                # prefill that never answers (0.5.17 NIXL has no timeout there) turn success into failure.
                if not prefill_task.done():
                    await asyncio.wait((prefill_task,), timeout=self.settings.prefill_grace_s)
                if not prefill_task.done():  # the prefill outlived its decode: free it
                    prefill_task.cancel()
                    if pair.prefill is not None:  # it is: the pair has a prefill leg
                        self.abort_in_background(pair.prefill, rid)
                elif (failure := prefill_task.exception()) is not None:
                    raise failure
                else:
                    answer.kv_wait_s = prefill_task.result() - t0
        except BaseException as exc:
            await self._attempt_failed(exc, pair, rid, prefill_task, answer.progress)
            raise
        finally:
            if answer.progress is not None:
                answer.progress.attempt = None
