"""How a dispatch fails: LegFailure (one leg of one attempt), DispatchError (for good), and HTTP/SSE error parsing."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import orjson

from orchestrator.router.dispatch.policies import NoWorkerError, WorkerState
from orchestrator.router.json_response import error_object


class LegFailure(Exception):
    """One leg (prefill or decode) of one attempt failed; `kind` is a short label (timeout, http_500...)."""

    def __init__(self, kind: str, leg: str, worker: str, message: str, retryable: bool, status: int = 502,
                 body: Any = None):
        super().__init__(f"{kind}: {leg} {worker}: {message}")
        self.kind = kind
        self.leg = leg
        self.worker = worker
        self.retryable = retryable
        self.status = status  # HTTP status to show a client if this is the final failure
        self.body = body  # the server's own error body, passed through for client errors (4xx)


class DispatchError(Exception):
    """A request failed for good (after retries); carries the HTTP status a client should see."""

    def __init__(self, message: str, status: int, attempts: int, body: Any = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.attempts = attempts
        self.body = body
        self.code = code  # a slug for the client's error object (decode_timeout, no_worker, ...)


def error_message(payload: Any) -> str:
    """The message of an engine's error body (SGLang's {"error": ...}, {"message"}, FastAPI's {"detail"}), at most 300 chars."""
    if isinstance(payload, dict):
        err = payload.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        if err is not None:
            return str(err)[:300]
        if "message" in payload:
            return str(payload["message"])[:300]
        if "detail" in payload:
            return str(payload["detail"])[:300]
    return str(payload)[:300]


def engine_error_object(status: int, body: Any) -> dict:
    """An engine's own error body (SGLang: `{"error": {"message"}}` from /generate, its flat `{"object": "error",
    "message", "type", "param", "code": <int>}`, FastAPI's `{"detail"}`) in OpenAI's shape: its message, and its
    param/code where they are strings."""
    inner = body.get("error") if isinstance(body, dict) else None
    fields = inner if isinstance(inner, dict) else body if isinstance(body, dict) else {}
    param, code = fields.get("param"), fields.get("code")
    return error_object(status, error_message(body), param if isinstance(param, str) else None,
                        code if isinstance(code, str) else None)


def client_error_object(status: int, message: str, body: Any = None, code: str | None = None) -> dict:
    """What a client is told of a failed request, in a response or inside its stream: the engine's own client error
    (4xx, its body) in OpenAI's shape, else the gateway's words with its code."""
    if body is not None and 400 <= status < 500:
        return engine_error_object(status, body)
    return error_object(status, message, code=code)


def failure_error_object(failure: LegFailure) -> dict:
    """A leg's failure as a client is told it, with the `<leg>_<kind>` code its non-streamed failures carry."""
    return client_error_object(failure.status, str(failure), failure.body, f"{failure.leg}_{failure.kind}")


def http_failure(leg: str, w: WorkerState, status: int, raw: bytes) -> LegFailure:
    """A leg answered with an HTTP error: retryable on another pair for 5xx and 429, not for another 4xx."""
    try:
        body: Any = json.loads(raw)
    except ValueError:
        body = raw.decode(errors="replace")
    # 4xx is about the request (too long, malformed): the same body fails on any pair, so no retry.
    retryable = status >= 500 or status == 429
    return LegFailure(f"http_{status}", leg, w.name, error_message(body), retryable, status, body)


def raise_if_aborted(leg: str, w: WorkerState, chunk: dict) -> None:
    """Raise LegFailure if `chunk` is SGLang's abort answer (finish_reason type abort, with its status code)."""
    meta = chunk.get("meta_info") or {}
    reason = meta.get("finish_reason")
    if isinstance(reason, dict) and reason.get("type") == "abort":
        code = int(reason.get("status_code") or 500)
        raise LegFailure("aborted", leg, w.name, str(reason.get("message")), code >= 500, code)


def raise_if_stream_aborted(leg: str, w: WorkerState, raw: bytes) -> None:
    """Raise LegFailure if the last event of a whole SSE answer is SGLang's abort chunk."""
    # Only the last event can be the abort; `data: [DONE]` may follow it.
    for event in reversed(raw.rstrip().split(b"\n\n")[-2:]):
        line = event.strip()
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        try:
            chunk = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            return
        if isinstance(chunk, dict):
            raise_if_aborted(leg, w, chunk)
        return


@dataclass
class RetryState:
    """What a retry loop saw: the last failure and how many attempts reached a worker pair."""

    last: "LegFailure | NoWorkerError | None" = None
    attempts: int = 0


def final_error(last: LegFailure | NoWorkerError | None, attempts: int, deadline_at: float | None) -> DispatchError:
    """What the client gets once retries are over: the last leg failure, no worker, or the deadline."""
    if isinstance(last, LegFailure):
        return DispatchError(f"{last} (after {attempts} attempt(s))", last.status, attempts,
                             last.body if 400 <= last.status < 500 else None, f"{last.leg}_{last.kind}")
    if isinstance(last, NoWorkerError):
        return DispatchError(f"no_worker: {last}", 503, attempts, code="no_worker")
    left = None if deadline_at is None else deadline_at - time.time()
    return DispatchError(
        f"deadline: the run deadline passed before the request could be sent (left {left:.1f}s)"
        if left is not None else "deadline: no time left", 504, attempts, code="deadline_exceeded",
    )
