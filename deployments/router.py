"""PD router deployment: `ingress (FastAPI) -> PDRouter -> {prefill workers, decode workers}` over HTTP.

`PDRouter` is the Serve deployment; it follows the worker registry (endpoints appear and disappear as
worker replicas start and stop) and hands every request to a `PDDispatcher`, which talks to the engine
servers directly over HTTP (a Serve hop per token would cost ~1 ms). Two ways in:
- the benchmark's handle API: `wait_ready(...)`, then `generate_batch(...)` (stream=True handle), one
  `RequestResult` per finished request;
- HTTP: SGLang's `/generate`, OpenAI `/v1/completions` and `/v1/chat/completions` (stream or not),
  `/health`, `/v1/models`, `/server_info`, `/model_info`, so `sglang.bench_serving` and the openai
  client work unmodified. Prompts are sent to engines as token ids from the faithful tokenizer.

`RouterCore` holds the state and logic without Serve, so the HTTP app (`build_http_app`) also runs under
plain uvicorn in tests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator
from ray import serve

from orchestrator.config import RunConfig
from orchestrator.ingress_metrics import IngressTracker
from orchestrator.pd_dispatch import DispatchError, DispatchSettings, PDDispatcher
from orchestrator.protocol import BenchRequest, RequestResult, WorkerEndpoint
from orchestrator.sse import json_events, last_json_event

log = logging.getLogger(__name__)

REGISTRY_POLL_S = 1.0
HEALTH_CHECK_EVERY_S = 5.0
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
DEFAULT_CHAT_TOKENS = 128  # SGLang's default max_new_tokens


# ---- HTTP bodies ---------------------------------------------------------------------------------------


class GenerateBody(BaseModel):
    """SGLang `/generate`: one prompt (text or input_ids) or a batch; other SGLang fields pass through."""

    model_config = ConfigDict(extra="allow")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False

    @model_validator(mode="after")
    def _one_prompt_field(self) -> "GenerateBody":
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("set exactly one of 'text' or 'input_ids'")
        if self.input_ids is not None and (not self.input_ids or any(x == [] for x in self.input_ids)):
            raise ValueError("input_ids: a prompt needs at least one token id")
        n = self.sampling_params.get("max_new_tokens")
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
            raise ValueError(f"sampling_params.max_new_tokens must be a non-negative integer (got {n!r})")
        return self


class CompletionBody(BaseModel):
    """OpenAI `/v1/completions` (the fields engines act on; unknown ones are accepted and ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1, description="only n=1: PD rooms per sample are not worth the risk")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    ignore_eos: bool = False
    seed: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")


class ChatBody(BaseModel):
    """OpenAI `/v1/chat/completions` (text content only)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    ignore_eos: bool = False
    seed: int | None = None


class HTTPError(Exception):
    """An error answered as `{"error": {"message", "type", "code"}}` (OpenAI's shape; SGLang's has .message)."""

    def __init__(self, status: int, message: str, body: Any = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body


def error_response(status: int, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    return "invalid request: " + "; ".join(parts[:5])


def deepseek_chat_prompt(messages: list[ChatMessage]) -> str:
    """DeepSeek-R1's chat template in its simplest form (system first, then turns, open assistant turn)."""
    system = "".join(m.text() for m in messages if m.role in ("system", "developer"))
    turns = []
    for m in messages:
        if m.role == "user":
            turns.append("<｜User｜>" + m.text())
        elif m.role == "assistant":
            turns.append("<｜Assistant｜>" + m.text() + "<｜end▁of▁sentence｜>")
    return system + "".join(turns) + "<｜Assistant｜>"


# ---- the router's state and logic, without Serve ------------------------------------------------------


class RouterCore:
    """Worker set (from the registry), dispatcher, tokenizer, limits: everything the entry points share."""

    def __init__(self, cfg: RunConfig, run_id: str = "run", metrics: Any = None):
        self.cfg = cfg
        self.run_id = run_id
        self.metrics = metrics
        self.model_name = cfg.model.name
        self.dispatcher = PDDispatcher(DispatchSettings.from_router_config(cfg.router), cfg.layout.mode, metrics)
        self.api_key = self._read_api_key(cfg.router.api_key_env)
        self._tokenizer = None
        self._tokenizer_lock = asyncio.Lock()
        self.registry_version: int | None = None
        self._last_health_check = 0.0

    @staticmethod
    def _read_api_key(env: str | None) -> str | None:
        if env is None:
            return None
        key = os.environ.get(env)
        if not key:
            raise ValueError(
                f"router.api_key_env={env!r} but ${env} is empty in the router's environment; export it "
                "where the cluster runs (or pass it through the job's runtime_env), or unset router.api_key_env"
            )
        return key

    @property
    def roles(self) -> tuple[str, ...]:
        return ("aggregated",) if self.cfg.layout.mode == "aggregated" else ("prefill", "decode")

    # -- workers --

    def follow(self, version: int, endpoints: list[WorkerEndpoint]) -> None:
        if version != self.registry_version:
            self.registry_version = version
            self.dispatcher.set_workers(endpoints)
            if self.metrics is not None:
                for e in endpoints:  # series start at 0 so rate()/increase() count a worker's first tokens
                    self.metrics.add_worker(e.role, e.name)
            log.info("router: registry v%d, workers %s", version, sorted(e.name for e in endpoints))

    async def maybe_check_health(self) -> None:
        if time.monotonic() - self._last_health_check >= HEALTH_CHECK_EVERY_S:
            self._last_health_check = time.monotonic()
            await self.dispatcher.check_health()

    def ready_counts(self) -> dict[str, int]:
        counts = {role: 0 for role in self.roles}
        for w in self.dispatcher.workers.values():
            if w.healthy and w.endpoint.role in counts:
                counts[w.endpoint.role] += 1
        return counts

    # -- prompts --

    async def tokenizer(self):
        async with self._tokenizer_lock:
            if self._tokenizer is None:
                from orchestrator.tokenizer import load_tokenizer

                self._tokenizer = await asyncio.to_thread(load_tokenizer, self.cfg.model.path)
        return self._tokenizer

    async def encode(self, text: str) -> list[int]:
        return (await self.tokenizer()).encode(text, add_special_tokens=True)

    async def decode_text(self, ids: list[int]) -> str:
        return (await self.tokenizer()).decode(ids)

    def check_prompt_len(self, n_tokens: int, where: str) -> None:
        limit = self.cfg.router.max_prompt_tokens
        if n_tokens > limit:
            raise HTTPError(
                400, f"{where}: prompt has {n_tokens} tokens, more than router.max_prompt_tokens={limit}; "
                "shorten the prompt or raise router.max_prompt_tokens"
            )

    async def to_input_ids(self, body: GenerateBody) -> dict:
        """The engine body: text replaced by faithful token ids (SGLang 0.5.17's own tokenizer mangles DeepSeek)."""
        out = body.model_dump(exclude_none=True)
        if body.text is not None:
            out.pop("text")
            if isinstance(body.text, list):
                out["input_ids"] = [await self.encode(t) for t in body.text]
            else:
                out["input_ids"] = await self.encode(body.text)
        ids = out["input_ids"]
        batched = bool(ids) and isinstance(ids[0], list)
        for i, item in enumerate(ids if batched else [ids]):
            self.check_prompt_len(len(item), f"input_ids[{i}]" if batched else "input_ids")
        out.pop("rid", None)  # the router owns rids: they must be unique and prefix-free
        return out

    # -- dispatch --

    @staticmethod
    async def _dispatched(track: IngressTracker, dispatch: Awaitable[Any]) -> Any:
        """The dispatcher's answer; a DispatchError becomes its HTTP error, and every failure is counted."""
        try:
            return await dispatch
        except DispatchError as exc:
            track.failed(str(exc))
            raise HTTPError(exc.status, str(exc), exc.body) from None
        except BaseException:
            track.failed("cancelled: the client went away")
            raise

    async def generate(self, body: dict) -> dict:
        track = IngressTracker(self.metrics, body)
        answer = await self._dispatched(track, self.dispatcher.generate(body, progress=track.progress))
        track.answered(answer.payload, answer.pair, answer.ttft_s, answer.kv_wait_s)
        return answer.payload

    async def open_stream(self, body: dict):
        track = IngressTracker(self.metrics, body)
        relay = await self._dispatched(track, self.dispatcher.open_stream(body))

        def on_close(relay, completed: bool) -> None:
            last = last_json_event(relay.tail) if completed else None
            if last is None or "error" in last:
                track.failed(f"stream from {relay.pair.decode.name} ended without its final event")
            else:
                ttft_s = relay.first_byte_at - track.started if relay.first_byte_at is not None else None
                track.answered(last, relay.pair, ttft_s=ttft_s)

        relay.on_close = on_close
        return relay

    async def server_info(self) -> dict:
        """mini_lb's merged shape: decode internal_states first, then every server's info by role."""
        session = self.dispatcher.session
        merged: dict[str, Any] = {"router": "pd-orchestrator", "run_id": self.run_id, "internal_states": []}
        for w in sorted(self.dispatcher.workers.values(), key=lambda w: w.name):
            try:
                async with session.get(w.endpoint.url + "/server_info") as r:
                    info = await r.json(content_type=None)
            except Exception as exc:  # one unreachable worker must not hide the others
                info = {"error": repr(exc)}
            info["worker"] = w.name
            merged.setdefault(w.endpoint.role, []).append(info)
            if w.endpoint.role in ("decode", "aggregated"):
                merged["internal_states"].extend(info.get("internal_states") or [])
            if info.get("simulated"):
                merged["simulated"] = True
        if not merged["internal_states"]:
            merged["internal_states"] = [{"last_gen_throughput": 0.0, "avg_spec_accept_length": None}]
        return merged

    async def model_info(self) -> dict:
        for w in sorted(self.dispatcher.workers.values(), key=lambda w: w.name):
            try:
                async with self.dispatcher.session.get(w.endpoint.url + "/model_info") as r:
                    if r.status == 200:
                        return await r.json(content_type=None)
            except Exception:
                continue
        return {"model_path": self.cfg.model.path or self.model_name, "tokenizer_path": self.cfg.model.path,
                "is_generation": True}


# ---- HTTP app ------------------------------------------------------------------------------------------


def _core(request: Request) -> RouterCore:
    core = getattr(request.app.state, "core", None)
    if core is None:  # under Serve: the replica's PDRouter instance owns the core
        router = serve.get_replica_context().servable_object
        router._ensure_following()
        core = router.core
    return core


def _sampling_from_openai(body: CompletionBody | ChatBody, default_tokens: int) -> dict:
    max_tokens = body.max_tokens
    if isinstance(body, ChatBody) and body.max_completion_tokens is not None:
        max_tokens = body.max_completion_tokens
    sp: dict[str, Any] = {"max_new_tokens": default_tokens if max_tokens is None else max_tokens}
    for key in ("temperature", "top_p", "stop"):
        value = getattr(body, key)
        if value is not None:
            sp[key] = value
    if body.ignore_eos:
        sp["ignore_eos"] = True
    return sp


def _finish_reason(meta: dict) -> str | None:
    reason = meta.get("finish_reason")
    if isinstance(reason, dict):
        return {"length": "length", "stop": "stop"}.get(reason.get("type"), reason.get("type"))
    return reason


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _openai_stream(core: RouterCore, engine_body: dict, kind: str, model: str, rid: str,
                         prompt_tokens: int, include_usage: bool) -> AsyncIterator[bytes]:
    """Translate the engine's SSE into OpenAI completion/chat chunks (text deltas), ending with [DONE]."""
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
            if "error" in event:
                yield _sse({"error": event["error"]})
                break
            meta = event.get("meta_info") or {}
            completion_tokens = int(meta.get("completion_tokens") or completion_tokens)
            text = event.get("text") or ""
            # SGLang streams cumulative text by default, increments with --incremental-streaming-output
            delta = text[len(sent_text):] if text.startswith(sent_text) else text
            sent_text = text if text.startswith(sent_text) else sent_text + text
            finish = _finish_reason(meta)
            if finish == "abort":
                reason = meta.get("finish_reason") or {}
                yield _sse({"error": {"message": f"aborted: {reason.get('message')}", "type": "server_error",
                                      "code": reason.get("status_code", 500)}})
                break
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if kind == "chat":
                choice["delta"] = {"content": delta} if delta else {}
            else:
                choice["text"] = delta
                choice["logprobs"] = None
            if delta or finish:
                yield _sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]})
        if include_usage:
            yield _sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                  "total_tokens": prompt_tokens + completion_tokens}})
        yield b"data: [DONE]\n\n"

    return chunks()


def build_http_app() -> FastAPI:
    """The ingress routes; each handler finds the RouterCore via `_core` (app.state or the Serve replica)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        core = getattr(app.state, "core", None)
        if core is not None:  # close pooled engine connections with the server
            await core.dispatcher.close()

    app = FastAPI(title="pd-orchestrator router", docs_url=None, redoc_url=None, lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, _validation_message(exc))

    @app.exception_handler(HTTPError)
    async def _http_error(_request: Request, exc: HTTPError) -> JSONResponse:
        if exc.body is not None and 400 <= exc.status < 500:
            return JSONResponse(exc.body, exc.status)  # the engine's own client error, as SGLang shows it
        return error_response(exc.status, exc.message)

    async def authorised(request: Request, core: RouterCore = Depends(_core)) -> RouterCore:
        if core.api_key is not None:
            got = request.headers.get("authorization", "")
            if not secrets.compare_digest(got.encode(), f"Bearer {core.api_key}".encode()):
                raise HTTPError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' "
                                     f"(the key is in ${core.cfg.router.api_key_env} where the router runs)")
        return core

    @app.get("/health")
    async def health(core: RouterCore = Depends(_core)) -> Response:
        counts = core.ready_counts()
        missing = [role for role, n in counts.items() if n == 0]
        if missing:
            return error_response(503, f"no healthy {' or '.join(missing)} worker yet (healthy: {counts})")
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models(core: RouterCore = Depends(authorised)) -> dict:
        return {"object": "list", "data": [{
            "id": core.model_name, "object": "model", "created": 0, "owned_by": "pd-orchestrator",
            "root": core.model_name, "max_model_len": core.cfg.model.context_length,
        }]}

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info(core: RouterCore = Depends(authorised)) -> dict:
        return await core.server_info()

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info(core: RouterCore = Depends(authorised)) -> dict:
        return await core.model_info()

    @app.post("/generate")
    async def generate(body: GenerateBody, core: RouterCore = Depends(authorised)) -> Response:
        engine_body = await core.to_input_ids(body)
        if body.stream:
            relay = await core.open_stream(engine_body)
            return StreamingResponse(relay.chunks(), media_type="text/event-stream")
        return JSONResponse(await core.generate(engine_body))

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, core: RouterCore = Depends(authorised)) -> Response:
        prompts: list[list[int]]
        p = body.prompt
        if isinstance(p, str):
            prompts = [await core.encode(p)]
        elif p and isinstance(p[0], str):
            prompts = [await core.encode(t) for t in p]  # type: ignore[arg-type]
        elif p and isinstance(p[0], list):
            prompts = list(p)  # type: ignore[arg-type]
        else:
            prompts = [list(p)]  # type: ignore[arg-type]
        for i, ids in enumerate(prompts):
            core.check_prompt_len(len(ids), f"prompt[{i}]" if len(prompts) > 1 else "prompt")
        sampling = _sampling_from_openai(body, DEFAULT_COMPLETION_TOKENS)
        model = body.model or core.model_name
        rid = "cmpl-" + uuid.uuid4().hex
        if body.stream:
            if len(prompts) != 1:
                raise HTTPError(400, "prompt: streaming takes one prompt; send one request per prompt")
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            stream = await _openai_stream(core, {"input_ids": prompts[0], "sampling_params": sampling,
                                                 "stream": True}, "completion", model, rid,
                                          len(prompts[0]), include_usage)
            return StreamingResponse(stream, media_type="text/event-stream")
        answers = await asyncio.gather(*(
            core.generate({"input_ids": ids, "sampling_params": sampling}) for ids in prompts))
        choices, completion_tokens = [], 0
        for i, a in enumerate(answers):
            meta = a.get("meta_info") or {}
            completion_tokens += int(meta.get("completion_tokens") or 0)
            text = a.get("text") or (await core.decode_text(a.get("output_ids") or []))
            choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": _finish_reason(meta)})
        prompt_tokens = sum(len(ids) for ids in prompts)
        return JSONResponse({
            "id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                          "total_tokens": prompt_tokens + completion_tokens},
        })

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody, core: RouterCore = Depends(authorised)) -> Response:
        ids = await core.encode(deepseek_chat_prompt(body.messages))
        core.check_prompt_len(len(ids), "messages")
        sampling = _sampling_from_openai(body, DEFAULT_CHAT_TOKENS)
        model = body.model or core.model_name
        rid = "chatcmpl-" + uuid.uuid4().hex
        engine_body = {"input_ids": ids, "sampling_params": sampling}
        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            stream = await _openai_stream(core, {**engine_body, "stream": True}, "chat", model, rid, len(ids),
                                          include_usage)
            return StreamingResponse(stream, media_type="text/event-stream")
        answer = await core.generate(engine_body)
        meta = answer.get("meta_info") or {}
        completion_tokens = int(meta.get("completion_tokens") or 0)
        text = answer.get("text") or (await core.decode_text(answer.get("output_ids") or []))
        return JSONResponse({
            "id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": _finish_reason(meta)}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": completion_tokens,
                      "total_tokens": len(ids) + completion_tokens},
        })

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(core: RouterCore = Depends(authorised)) -> dict:
        out = {}
        for w in core.dispatcher.workers.values():
            try:
                async with core.dispatcher.session.post(w.endpoint.url + "/flush_cache") as r:
                    out[w.name] = r.status
            except Exception as exc:
                out[w.name] = repr(exc)
        return out

    return app


http_app = build_http_app()


# ---- the Serve deployment -------------------------------------------------------------------------------


def _make_metrics(cfg: RunConfig, run_id: str):
    """RouterMetrics plus its own exporter on a free port, listed in the run's Prometheus file_sd."""
    from orchestrator.metrics import RouterMetrics
    from orchestrator.scrape import serve_metrics

    metrics = RouterMetrics(run_id, cfg.layout.describe())
    try:
        replica = serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside Serve (uvicorn tests): one router per process
        replica = str(os.getpid())
    try:
        exporter = serve_metrics(metrics.registry, f"router-{replica}", run_id, cfg.metrics, port=0)
    except Exception as exc:  # metrics are an aid: a router without an exporter still routes
        log.warning("router metrics exporter not started: %r", exc)
        exporter = None
    return metrics, exporter


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100_000)
@serve.ingress(http_app)
class PDRouter:
    """One router replica: follows the registry, answers the handle API and the HTTP ingress."""

    def __init__(self, cfg: RunConfig | dict, run_id: str = "run"):
        self.cfg = cfg if isinstance(cfg, RunConfig) else RunConfig.model_validate(cfg)
        self.metrics, self.exporter = _make_metrics(self.cfg, run_id)
        self.core = RouterCore(self.cfg, run_id, self.metrics)
        self._follower: asyncio.Task | None = None
        try:  # Serve builds replicas inside their event loop; if not, the first call starts following
            self._ensure_following()
        except RuntimeError:
            pass

    def _ensure_following(self) -> None:
        if self._follower is None or self._follower.done():
            self._follower = asyncio.get_running_loop().create_task(self._follow_registry())

    async def _follow_registry(self) -> None:
        from orchestrator.registry import get_registry

        registry = get_registry()
        while True:
            try:
                version, endpoints = await registry.snapshot.remote()
                self.core.follow(version, endpoints)
                await self.core.maybe_check_health()
            except Exception as exc:  # keep following: a registry restart must not stop routing
                log.warning("router: registry poll failed: %r", exc)
            await asyncio.sleep(REGISTRY_POLL_S)

    async def check_health(self) -> None:
        self._ensure_following()  # Serve calls this soon after start: begin following right away

    async def wait_ready(self, expected: dict[str, int], timeout_s: float) -> list[WorkerEndpoint]:
        """Return once `expected` workers per role are registered and answer /health 200."""
        self._ensure_following()
        from orchestrator.registry import get_registry

        registry = get_registry()
        deadline = time.monotonic() + timeout_s
        while True:
            version, endpoints = await registry.snapshot.remote()
            self.core.follow(version, endpoints)
            health = await self.core.dispatcher.check_health()
            ready = [w.endpoint for w in self.core.dispatcher.workers.values() if health.get(w.name)]
            counts = {role: sum(1 for e in ready if e.role == role) for role in expected}
            if all(counts[role] >= n for role, n in expected.items()):
                return ready
            if time.monotonic() > deadline:
                registered = {role: sum(1 for e in endpoints if e.role == role) for role in expected}
                raise TimeoutError(
                    f"workers not ready after {timeout_s:.0f}s: expected {expected}, registered {registered}, "
                    f"healthy {counts}; see the engine logs (worker endpoint_info / runs/*/logs)"
                )
            await asyncio.sleep(0.5)

    async def generate_batch(self, requests: list[BenchRequest], max_in_flight: int,
                             deadline_at: float | None) -> AsyncIterator[RequestResult]:
        """One RequestResult per finished request, in completion order (call with a stream=True handle)."""
        self._ensure_following()
        async for result in self.core.dispatcher.run_batch(requests, max_in_flight, deadline_at):
            yield result

    async def workers(self) -> list[WorkerEndpoint]:
        self._ensure_following()
        return [w.endpoint for w in self.core.dispatcher.workers.values()]

    def metrics_address(self) -> str | None:
        """host:port of this replica's Prometheus exporter (for the scrape file), None if not running."""
        return self.exporter.address if self.exporter is not None else None
