"""The simulated engine's OpenAI routes, `/v1/completions` and `/v1/chat/completions`, as SGLang 0.5.17 serves them.

Bodies are `orchestrator.api.openai`'s (the router's gateway validates the same models); each becomes a
/generate body (`orchestrator.api.generate`: SGLang's _convert_to_internal_request) and runs through the
engine like one, PD bootstrap fields included. The answers' shapes are `frames.py`'s.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any, AsyncIterator

import orjson
from aiohttp import web
from pydantic import ValidationError

from orchestrator.api.generate import BadRequest, GenerateBody, invalid_body_message
from orchestrator.api.openai import (
    DEFAULT_COMPLETION_TOKENS,
    ChatBody,
    CompletionBody,
    chat_prompt,
    chat_template_of,
    include_usage,
    requested_max_tokens,
    sampling_params,
)
from orchestrator.engines.sim.engine import SimEngine
from orchestrator.engines.sim.inflight import Run
from orchestrator.engines.sim.openai.frames import chat_chunks, completion_chunks, full_response, openai_error
from orchestrator.engines.sim.requests import normalise, require_codec

SGLANG_DEFAULT_MODEL_NAME = "default"  # protocol.py's DEFAULT_MODEL_NAME: `model` when a request leaves it out


class SimOpenAiApi:
    """aiohttp handlers for SGLang's OpenAI routes over a SimEngine."""

    def __init__(self, engine: SimEngine):
        self.engine = engine
        self.chat_template = chat_template_of(engine.arch.name)

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CompletionBody, "completion")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, ChatBody, "chat")

    # ----- one request -----------------------------------------------------------------------------------------
    async def _serve(self, request: web.Request, model: type[CompletionBody] | type[ChatBody], kind: str,
                     ) -> web.StreamResponse:
        e = self.engine
        media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":  # SGLang's validate_json_request
            return openai_error(400, f"content-type: Unsupported Media Type: Only 'application/json' is allowed "
                                     f"(got {media_type or 'none'})", HTTPStatus.BAD_REQUEST.phrase)
        if (unavailable := e.unavailable()) is not None:
            return openai_error(503, unavailable, "503")
        fate = await e.faults.admit_request()
        try:
            body = model.model_validate_json(await request.read())
        except ValidationError as exc:
            return openai_error(400, invalid_body_message(exc.errors()), HTTPStatus.BAD_REQUEST.phrase)
        try:
            generate = self._generate_body(body, kind)
            items = normalise(generate, e.codec)
            for item in items:
                e.check_item(item)
        except BadRequest as exc:
            return openai_error(400, str(exc), "BadRequest")
        if fate.error:
            return openai_error(500, "Simulated fault (error_rate): internal server error.", "InternalServerError")
        runs = [e.start_run(item, fate, body.stream) for item in items]
        name = body.model or SGLANG_DEFAULT_MODEL_NAME
        if body.stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            frame = chat_chunks if kind == "chat" else completion_chunks
            try:
                async for chunk in frame(self._deltas(runs), name, include_usage(body)):
                    await resp.write(chunk)
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
            except (ConnectionResetError, asyncio.CancelledError):  # the client went away: SGLang aborts the request
                e.abort_unfinished(runs)
                raise
            return resp
        await e.until_done(runs)
        for run in runs:
            if run.error is not None:
                return openai_error(run.error[0], run.error[1], str(run.error[0]))
        outs = [e.response(run) for run in runs]
        return web.json_response(full_response(outs, name, kind), dumps=lambda o: orjson.dumps(o).decode())

    def _generate_body(self, body: Any, kind: str) -> GenerateBody:
        """The /generate body SGLang's adapter makes of an OpenAI body (its _convert_to_internal_request)."""
        e = self.engine
        if kind == "chat":
            prompt: Any = {"input_ids": require_codec(e.codec).encode(chat_prompt(body.messages, self.chat_template))}
        elif isinstance(body.prompt, str) or (isinstance(body.prompt, list) and body.prompt
                                              and isinstance(body.prompt[0], str)):
            prompt = {"text": body.prompt}
        else:
            prompt = {"input_ids": body.prompt}
        if not next(iter(prompt.values())):
            raise BadRequest("Prompt cannot be empty")
        max_tokens = requested_max_tokens(body)
        if max_tokens is None:
            if kind == "chat":  # SGLang sets no budget: the request may run to the context length
                max_tokens = max(1, e.scheduler.max_request_tokens() - len(prompt["input_ids"]))
            else:
                max_tokens = DEFAULT_COMPLETION_TOKENS
        if body.min_tokens > max_tokens:
            raise BadRequest(f"min_tokens ({body.min_tokens}) must not exceed the completion budget ({max_tokens}: "
                             "max_tokens or max_completion_tokens); lower min_tokens or raise the budget")
        fields = {name: getattr(body, name) for name in ("rid", "bootstrap_host", "bootstrap_port", "bootstrap_room")
                  if getattr(body, name) is not None}
        try:
            return GenerateBody.model_validate({**prompt, **fields, "sampling_params": sampling_params(body, max_tokens),
                                                "stream": body.stream})
        except ValidationError as exc:
            raise BadRequest(invalid_body_message(exc.errors())) from None

    async def _deltas(self, runs: list[Run]) -> AsyncIterator[tuple[int, dict, str]]:
        """(prompt index, SGLang's cumulative answer so far, new text) for every update of every run, in order."""
        updates: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, run: Run) -> None:
            sent_ids, sent_text = 0, ""
            while True:
                if len(run.req.output_ids) > sent_ids and run.req.finished:
                    await run.done.wait()  # the last tokens go out with the finish_reason, in one chunk
                done = run.done.is_set()
                if len(run.req.output_ids) > sent_ids or done:
                    out = self.engine.response(run)
                    text = out["text"]
                    updates.put_nowait((index, out, text[len(sent_text):] if text.startswith(sent_text) else text))
                    sent_ids, sent_text = len(run.req.output_ids), text
                if done:
                    return
                await run.req.updated.wait()
                run.req.updated.clear()

        tasks = [asyncio.create_task(pump(i, run)) for i, run in enumerate(runs)]
        pending = len(tasks)
        try:
            while pending:
                index, out, delta = await updates.get()
                if out["meta_info"].get("finish_reason"):
                    pending -= 1
                yield index, out, delta
        finally:
            for task in tasks:
                task.cancel()
