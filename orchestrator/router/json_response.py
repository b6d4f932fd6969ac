"""The router's JSON responses, rendered by orjson (~10x faster than the json module on engine answers)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi.responses import JSONResponse


def json_bytes(obj: Any) -> bytes:
    """Compact JSON of `obj` by orjson; the json module where orjson refuses (an integer beyond 64 bits,
    which a client may send in fields passed through to the engine)."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, separators=(",", ":")).encode()


def error_object(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object, `{"error": {"message", "type", "param", "code"}}`: `code` is a string slug or null as
    OpenAI and sglang-router send it (SGLang 0.5.17's own server puts the HTTP status there as an int, which strict
    SDKs reject: the Java and .NET OpenAI clients read `code` as a string); the status is the response's own."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


SSE_DONE = b"data: [DONE]\n\n"  # the last event of every stream, as SGLang and OpenAI end theirs


def sse_error_event(error: dict) -> bytes:
    """A failure inside a running stream: `event: error` and OpenAI's error object as its data. AIPerf 0.12.0 makes
    a stream an error record only on an `event: error` (after a lone `data: {"error": ...}` a truncated stream stays a
    valid request); the openai client raises APIError on the data's `error` key whatever the event's name."""
    return b"event: error\ndata: " + json_bytes(error) + b"\n\n"


class FastJSONResponse(JSONResponse):
    """A JSONResponse whose body orjson renders (compact, UTF-8, same JSON)."""

    def render(self, content: Any) -> bytes:
        return json_bytes(content)
