"""OpenAI adapter: completions/chat bodies -> engine /generate bodies, engine SSE -> OpenAI chunks."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, AsyncIterator

from fastapi.responses import Response, StreamingResponse

from orchestrator.api.openai import (
    DEFAULT_CHAT_TOKENS,
    DEFAULT_COMPLETION_TOKENS,
    ChatBody,
    CompletionBody,
    chat_prompt,
    chat_template_of,
    finish_reason_type,
    include_usage,
    requested_max_tokens,
    sampling_params,
)
from orchestrator.api.sse import json_events
from orchestrator.router.core import HTTPError, RouterCore
from orchestrator.router.json_response import FastJSONResponse, json_bytes


def sampling_from_openai(body: CompletionBody | ChatBody, default_tokens: int) -> dict:
    max_tokens = requested_max_tokens(body)
    return sampling_params(body, default_tokens if max_tokens is None else max_tokens)


def _sse(obj: Any) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


async def openai_stream(core: RouterCore, engine_body: dict, kind: str, model: str, rid: str,
                         prompt_tokens: int, include_usage: bool) -> AsyncIterator[bytes]:
    """Translate the engine's SSE into OpenAI completion/chat chunks (text deltas), ending with [DONE]; a request that
    fails mid-stream ends with an `event: error` carrying OpenAI's error object before it (StreamRelay.ending)."""
    relay = await core.open_stream(engine_body)
    created = int(time.time())
    obj = "text_completion" if kind == "completion" else "chat.completion.chunk"

    async def chunks() -> AsyncIterator[bytes]:
        sent_text = ""
        completion_tokens = 0
        if kind == "chat":
            yield _sse({"id": rid, "object": obj, "created": created, "model": model,
                        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None}]})
        async for event in json_events(relay.chunks()):
            meta = event.get("meta_info") or {}
            if "error" in event or finish_reason_type(meta) == "abort":
                continue  # the engine's last event: the relay names the failure and the stream ends with its error
            completion_tokens = int(meta.get("completion_tokens") or completion_tokens)
            text = event.get("text") or ""
            # SGLang streams cumulative text by default, increments with --incremental-streaming-output
            delta = text[len(sent_text):] if text.startswith(sent_text) else text
            sent_text = text if text.startswith(sent_text) else sent_text + text
            finish = finish_reason_type(meta)
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if kind == "chat":
                choice["delta"] = {"content": delta} if delta else {}
            else:
                choice["text"] = delta
                choice["logprobs"] = None
            if delta or finish:
                yield _sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]})
        if include_usage and relay.failure is None:
            yield _sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                  "total_tokens": prompt_tokens + completion_tokens}})
        yield relay.ending()

    return chunks()


async def completions(core: RouterCore, body: CompletionBody) -> Response:
    """OpenAI `/v1/completions` (stream or not) over the PD dispatcher; prompts become token ids."""
    prompts: list[list[int]]
    p = body.prompt
    if isinstance(p, str):
        prompts = [await core.encode(p)]
    elif p and isinstance(p[0], str):
        prompts = [await core.encode(t) for t in p]
    elif p and isinstance(p[0], list):
        prompts = list(p)
    else:
        prompts = [list(p)]  # type: ignore[arg-type]  # list[int]: a str or list prompt took the branches above
    for i, ids in enumerate(prompts):
        core.check_prompt_len(len(ids), f"prompt[{i}]" if len(prompts) > 1 else "prompt")
    sampling = sampling_from_openai(body, DEFAULT_COMPLETION_TOKENS)
    model = body.model or core.model_name
    rid = "cmpl-" + uuid.uuid4().hex
    if body.stream:
        if len(prompts) != 1:
            raise HTTPError(400, "prompt: streaming takes one prompt; send one request per prompt")
        stream = await openai_stream(core, {"input_ids": prompts[0], "sampling_params": sampling,
                                             "stream": True}, "completion", model, rid,
                                      len(prompts[0]), include_usage(body))
        return StreamingResponse(stream, media_type="text/event-stream")
    answers = await asyncio.gather(*(
        core.generate({"input_ids": ids, "sampling_params": sampling}) for ids in prompts))
    choices, completion_tokens = [], 0
    for i, a in enumerate(answers):
        meta = a.get("meta_info") or {}
        completion_tokens += int(meta.get("completion_tokens") or 0)
        text = a.get("text") or (await core.decode_text(a.get("output_ids") or []))
        choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": finish_reason_type(meta)})
    prompt_tokens = sum(len(ids) for ids in prompts)
    return FastJSONResponse({
        "id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": choices, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                      "total_tokens": prompt_tokens + completion_tokens},
    })

async def chat_completions(core: RouterCore, body: ChatBody) -> Response:
    """OpenAI `/v1/chat/completions` with the model's chat template (DeepSeek's or Qwen's); text content only."""
    model_cfg = core.cfg.model
    template = chat_template_of(model_cfg.preset or model_cfg.path or model_cfg.name)
    ids = await core.encode(chat_prompt(body.messages, template))
    core.check_prompt_len(len(ids), "messages")
    sampling = sampling_from_openai(body, DEFAULT_CHAT_TOKENS)
    model = body.model or core.model_name
    rid = "chatcmpl-" + uuid.uuid4().hex
    engine_body = {"input_ids": ids, "sampling_params": sampling}
    if body.stream:
        stream = await openai_stream(core, {**engine_body, "stream": True}, "chat", model, rid, len(ids),
                                      include_usage(body))
        return StreamingResponse(stream, media_type="text/event-stream")
    answer = await core.generate(engine_body)
    meta = answer.get("meta_info") or {}
    completion_tokens = int(meta.get("completion_tokens") or 0)
    text = answer.get("text") or (await core.decode_text(answer.get("output_ids") or []))
    return FastJSONResponse({
        "id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": finish_reason_type(meta)}],
        "usage": {"prompt_tokens": len(ids), "completion_tokens": completion_tokens,
                  "total_tokens": len(ids) + completion_tokens},
    })
