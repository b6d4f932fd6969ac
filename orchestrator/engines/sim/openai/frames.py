"""SGLang 0.5.17's OpenAI answers for the simulated engine: full responses, stream chunks, usage, error bodies.

Shapes from serving_chat.py / serving_completions.py / sse_utils.py / protocol.py: the response id is the
request id (meta_info.id); a chat stream opens with a role chunk and closes with a finish chunk of its own
(then usage, when asked); a completion stream carries finish_reason on its last text chunk; 400s are the flat
ErrorResponse, a failure mid-stream a `data: {"error": ...}` chunk.
"""

from __future__ import annotations

import json
import time
from http import HTTPStatus
from typing import Any, AsyncIterator

import orjson
from aiohttp import web

from orchestrator.api.openai import finish_reason_type


def openai_error(status: int, message: str, kind: str) -> web.Response:
    """SGLang's ErrorResponse for its OpenAI routes (flat, not nested under "error")."""
    return web.json_response({"object": "error", "message": message, "type": kind, "param": None, "code": status},
                             status=status)


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def full_response(outs: list[dict], name: str, kind: str) -> dict:
    """The non-streaming answer for the runs' SGLang outputs (one choice per prompt)."""
    choices = []
    for i, out in enumerate(outs):
        meta = out["meta_info"]
        reason = meta.get("finish_reason") or {}
        choice: dict[str, Any] = {"index": i}
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": out["text"], "reasoning_content": None,
                                 "tool_calls": None}
        else:
            choice["text"] = out["text"]
        choice.update(logprobs=None, finish_reason=finish_reason_type(meta), matched_stop=reason.get("matched"))
        choices.append(choice)
    return {"id": outs[0]["meta_info"]["id"], "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": int(time.time()), "model": name, "choices": choices,
            "usage": usage_of(outs), "metadata": {"weight_version": outs[0]["meta_info"]["weight_version"]}}


async def chat_chunks(updates: AsyncIterator[tuple[int, dict, str]], name: str, usage_wanted: bool
                      ) -> AsyncIterator[bytes]:
    """serving_chat._generate_chat_stream: role chunk, content deltas, then the finish chunk and usage."""
    created = int(time.time())
    started: set[int] = set()
    finished: dict[int, dict] = {}
    last: dict[int, dict] = {}

    def chunk(index: int, rid: str, delta: dict, reason: str | None = None, matched: Any = None) -> bytes:
        return sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": name,
                    "choices": [{"index": index, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
                                 "finish_reason": reason, "matched_stop": matched}]})

    async for index, out, delta in updates:
        meta = out["meta_info"]
        last[index] = out
        error = stream_error(meta)
        if error is not None:
            yield error
            break
        if index not in started:
            started.add(index)
            yield chunk(index, meta["id"], {"role": "assistant", "content": ""})
        if delta:
            yield chunk(index, meta["id"], {"content": delta})
        if meta.get("finish_reason"):
            finished[index] = meta["finish_reason"]
    for index, reason in finished.items():
        yield chunk(index, last[index]["meta_info"]["id"], {}, reason["type"], reason.get("matched"))
    if usage_wanted and last:
        yield sse({"id": next(iter(last.values()))["meta_info"]["id"], "object": "chat.completion.chunk",
                   "created": created, "model": name, "choices": [], "usage": usage_of(list(last.values()))})


async def completion_chunks(updates: AsyncIterator[tuple[int, dict, str]], name: str, usage_wanted: bool
                            ) -> AsyncIterator[bytes]:
    """serving_completions._generate_completion_stream: one chunk per update, finish_reason on the last."""
    created = int(time.time())
    last: dict[int, dict] = {}
    async for index, out, delta in updates:
        meta = out["meta_info"]
        last[index] = out
        error = stream_error(meta)
        if error is not None:
            yield error
            break
        reason = meta.get("finish_reason") or {}
        yield sse({"id": meta["id"], "object": "text_completion", "created": created, "model": name,
                   "choices": [{"index": index, "text": delta, "logprobs": None,
                                "finish_reason": reason.get("type"), "matched_stop": reason.get("matched")}],
                   "usage": None})
    if usage_wanted and last:
        usage = {k: v for k, v in usage_of(list(last.values())).items() if v is not None}
        yield sse({"id": next(iter(last.values()))["meta_info"]["id"], "object": "text_completion",
                   "created": created, "model": name, "choices": [], "usage": usage})


def usage_of(outs: list[dict]) -> dict:
    """UsageProcessor's usage (no --enable-cache-report: no prompt_tokens_details)."""
    prompt = sum(o["meta_info"].get("prompt_tokens", 0) for o in outs)
    completion = sum(o["meta_info"].get("completion_tokens", 0) for o in outs)
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "reasoning_tokens": sum(o["meta_info"].get("reasoning_tokens", 0)
                                                                   for o in outs)}


def stream_error(meta: dict) -> bytes | None:
    """A run aborted with a status code streams SGLang's error chunk (create_streaming_error_response)."""
    reason = meta.get("finish_reason") or {}
    if reason.get("type") != "abort" or reason.get("status_code") is None:
        return None
    status = HTTPStatus(int(reason["status_code"]))
    error = {"object": "error", "message": reason.get("message") or "Generation aborted.", "type": status.name,
             "param": None, "code": status.value}
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
