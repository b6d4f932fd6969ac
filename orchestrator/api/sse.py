"""SGLang's server-sent events: `data: {...}\n\n` chunks, the stream ending with `data: [DONE]` (the gateway's
failures mid-stream: `event: error\ndata: {"error": ...}\n\n` before it)."""

from __future__ import annotations

import orjson
from typing import AsyncIterator


async def data_payloads(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The raw `data:` payload of every event of a byte stream, `[DONE]` left out."""
    buffer = b""
    async for data in chunks:
        buffer += data
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            payload = _payload(event)
            if payload is not None:
                yield payload


async def json_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[dict]:
    """Every event of a byte stream as JSON, `[DONE]` left out."""
    async for payload in data_payloads(chunks):
        yield orjson.loads(payload)


def last_json_event(tail: bytes) -> dict | None:
    """The last complete JSON event in the end of a stream; None if there is none (or it was cut in half)."""
    for event in reversed(tail.split(b"\n\n")):
        payload = _payload(event)
        if payload is None:
            continue
        try:
            parsed = orjson.loads(payload)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


def _payload(event: bytes) -> bytes | None:
    line = event.strip()
    if not line.startswith(b"data:"):  # an event may name itself first (`event: error`, the gateway's failures)
        line = next((x for x in line.split(b"\n") if x.startswith(b"data:")), b"")
        if not line:
            return None
    payload = line[5:].strip()
    return None if payload == b"[DONE]" else payload
