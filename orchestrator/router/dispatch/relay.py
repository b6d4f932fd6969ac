"""StreamRelay: relay an open decode SSE stream to the client, aborting both legs if either fails, and say how it ended."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, AsyncIterator, Callable, Protocol

import aiohttp
import orjson

from orchestrator.api.sse import last_json_event
from orchestrator.router.dispatch.failures import LegFailure, error_message, failure_error_object, raise_if_aborted
from orchestrator.router.dispatch.pairs import fill_from_payload
from orchestrator.router.json_response import SSE_DONE, sse_error_event

if TYPE_CHECKING:
    from orchestrator.router.dispatch.pairs import Answer, Pair
    from orchestrator.router.dispatch.policies import WorkerState

log = logging.getLogger(__name__)

STREAM_TAIL_BYTES = 1 << 16  # enough for SGLang's last event (totals), output_ids included


class LegBook(Protocol):
    """What a relayed stream tells the dispatcher that opened it (PDDispatcher is one)."""

    def mark_suspect(self, w: WorkerState) -> None: ...
    def leg_done(self, w: WorkerState, tokens: int = 0) -> None: ...
    def abort_in_background(self, w: WorkerState, rid: str) -> None: ...


class StreamRelay:
    """An open decode SSE stream: `status` is known; iterate `chunks()` to relay bytes, then it closes and `failure`
    says whether the request failed (None: it completed, `last_event` holds its totals).

    The engine's `data: [DONE]` is held back: the client's stream ends with `ending()`, `[DONE]` alone or, after a
    failure, an `event: error` first. The prefill leg keeps running beside it; if it fails mid-stream the decode is
    aborted, so the stream ends with SGLang's own abort chunk rather than hanging.
    """

    def __init__(self, dispatcher: LegBook, resp: aiohttp.ClientResponse, pair: Pair, rid: str,
                 prefill_task: asyncio.Task | None, deadline: float, attempts: int, sent_at: float | None = None):
        self.status = resp.status
        self.attempts = attempts
        self.pair = pair
        self.rid = rid
        self._d = dispatcher
        self._resp = resp
        self._prefill_task = prefill_task
        self._deadline = deadline  # time.monotonic()
        self._closed = False
        self.tail = b""  # the stream's last bytes: its final event carries the totals
        self.first_byte_at: float | None = None  # time.monotonic()
        self.client_left = False  # the reader stopped (its client went away, or the gateway cut the stream off)
        self.failure: LegFailure | None = None  # why the stream failed, once it ended
        self.last_event: dict | None = None  # the completed stream's final event (its totals)
        self.sent_at = sent_at  # time.monotonic() when this attempt's legs were sent
        self.on_close: Callable[["StreamRelay"], None] | None = None
        if prefill_task is not None:
            prefill_task.add_done_callback(self._on_prefill_done)

    def _on_prefill_done(self, task: asyncio.Task) -> None:
        # A failed prefill means the decode will never get its KV: abort it now so its stream ends
        # with SGLang's abort chunk instead of waiting out the decode's own 300 s timeout.
        if not self._closed and not task.cancelled() and task.exception() is not None:
            if self.pair.prefill is not None:
                self._d.mark_suspect(self.pair.prefill)
            self._d.abort_in_background(self.pair.decode, self.rid)

    @property
    def kv_wait_s(self) -> float | None:
        """Send -> the prefill leg answered (prefill + KV transfer), as the non-streamed path counts it; None until
        the prefill leg has answered, or without one (aggregated)."""
        task = self._prefill_task
        if self.sent_at is None or task is None or not task.done() or task.cancelled() or task.exception():
            return None
        return task.result() - self.sent_at

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            while True:
                left = self._deadline - time.monotonic()
                if left <= 0:
                    raise asyncio.TimeoutError
                data = await asyncio.wait_for(self._resp.content.readany(), left)
                if not data:
                    break
                if self.first_byte_at is None:
                    self.first_byte_at = time.monotonic()
                self.tail = (self.tail + data)[-STREAM_TAIL_BYTES:]
                if data.endswith(SSE_DONE):
                    data = data[:-len(SSE_DONE)]
                if data:
                    yield data
            self.failure = self._failure_at_end()
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            timed_out = isinstance(exc, asyncio.TimeoutError)
            self.failure = LegFailure("timeout" if timed_out else "stream_cut", "decode", self.pair.decode.name,
                                      "no stream bytes before the leg's deadline" if timed_out
                                      else f"the stream broke off: {exc!r}", True, 504 if timed_out else 502)
            self._d.mark_suspect(self.pair.decode)
            log.warning("stream %s from %s ended early: %r", self.rid, self.pair.decode.name, exc)
        except BaseException:  # client went away (GeneratorExit / cancel): free both servers
            self.client_left = True
            raise
        finally:
            await self.close(abort=self.client_left or self.failure is not None)

    def ending(self) -> bytes:
        """The client stream's last bytes: `[DONE]`, after a failure preceded by an `event: error` whose data is
        OpenAI's error object (AIPerf 0.12.0 and the openai client both read it as the request's error)."""
        if self.failure is None:
            return SSE_DONE
        return sse_error_event(failure_error_object(self.failure)) + SSE_DONE

    def _failure_at_end(self) -> LegFailure | None:
        """How a stream the decode ended itself went: its final event, SGLang's error or abort event (a failed KV
        transfer aborts the decode), or a stream broken off (no `[DONE]`: the engine's process died or dropped the
        connection)."""
        w = self.pair.decode
        last = last_json_event(self.tail)
        if not self.tail.rstrip().endswith(SSE_DONE.rstrip()) or last is None:
            self._d.mark_suspect(w)
            return LegFailure("stream_cut", "decode", w.name, "the stream ended without its final event and [DONE]",
                              True, 502)
        if "error" in last:
            inner = last["error"]
            code = inner.get("code") if isinstance(inner, dict) else None
            return LegFailure("error", "decode", w.name, error_message(last), True,
                              code if isinstance(code, int) and code >= 400 else 500, body=last)
        try:
            raise_if_aborted("decode", w, last)
        except LegFailure as aborted:
            return aborted
        self.last_event = last
        return None

    async def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        self._resp.release()
        self._d.leg_done(self.pair.decode, self.pair.decode_tokens)
        if self._prefill_task is not None and not self._prefill_task.done():
            self._prefill_task.cancel()
            abort = True
        if abort:
            for w in (self.pair.prefill, self.pair.decode):
                if w is not None:
                    self._d.abort_in_background(w, self.rid)
        if self.on_close is not None:
            self.on_close(self)


def answer_from_stream(w: "WorkerState", raw: bytes, answer: "Answer") -> None:
    """A decode's whole SSE answer into `answer` (totals from the last event)."""
    # Only the last event (totals) is parsed on the hot path; the others only if the last one does not
    # carry the whole output_ids.
    events = _data_payloads(raw)
    if not events:
        raise LegFailure("empty", "decode", w.name, "stream ended without any data event", True, 502)
    try:
        last = orjson.loads(events[-1])
    except orjson.JSONDecodeError as exc:
        raise LegFailure("bad_json", "decode", w.name, f"last stream event is not JSON: {exc}", True, 502) from None
    answer.payload = last
    if "error" in last:
        raise LegFailure("error", "decode", w.name, error_message(last), True, 502, body=last)
    raise_if_aborted("decode", w, last)
    fill_from_payload(answer, last)
    if len(answer.output_ids) != answer.completion_tokens:  # incremental chunks: stitch them
        ids: list[int] = []
        for ev in events:
            chunk_ids = orjson.loads(ev).get("output_ids") or []
            ids.extend(chunk_ids)
        answer.output_ids = ids


def _data_payloads(raw: bytes) -> list[bytes]:
    """The `data:` payload of every event of a whole SSE body, `[DONE]` left out."""
    out = []
    for event in raw.split(b"\n\n"):
        line = event.strip()
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload != b"[DONE]":
                out.append(payload)
    return out
