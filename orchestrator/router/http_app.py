"""The router's HTTP ingress: FastAPI routes (SGLang /generate, OpenAI, /health, /server_info) over a RouterCore.

`serve_http(core, host, port)` serves them from the calling process's event loop (the router replica:
no Serve proxy and no Ray hop per request); `build_http_app()` is the same app for any ASGI server.
"""

from __future__ import annotations

import asyncio
import inspect
import secrets
import socket
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import orjson
import uvicorn
from pydantic import BaseModel, ValidationError

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchestrator.api.generate import GenerateBody, invalid_body_message, invalid_field
from orchestrator.api.openai import (
    ChatBody,
    CompletionBody,
)
from orchestrator.router import openai
from orchestrator.router.core import HTTPError, RouterCore
from orchestrator.router.dispatch.failures import client_error_object
from orchestrator.router.json_response import SSE_DONE, FastJSONResponse, error_object, sse_error_event


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    """OpenAI's error object (json_response.error_object); `param` names the offending field, `code` is a slug."""
    return FastJSONResponse(error_object(status, message, param, code), status)


async def core_in_app_state(request: Request) -> RouterCore:
    """The RouterCore the app carries in `app.state.core` (async: FastAPI runs a sync dependency in a
    thread pool, one thread hop per request)."""
    core = getattr(request.app.state, "core", None)
    if core is None:
        raise HTTPError(503, "router not initialised: no RouterCore in app.state.core")
    return core


INFERENCE_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})


class InFlightLimit:
    """ASGI wrapper: each inference request holds a slot of its RouterCore from arrival until its response (a stream
    too) has been sent; past router.max_in_flight_requests it is answered 503 at once, before its body is read."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        core = getattr(scope["app"].state, "core", None) if scope["type"] == "http" else None
        if core is None or scope["method"] != "POST" or scope["path"] not in INFERENCE_PATHS:
            await self.app(scope, receive, send)
            return
        try:
            core.take_slot()
        except HTTPError as exc:
            await error_response(exc.status, exc.message, code=exc.code)(scope, receive, send)
            return
        try:
            await _until_cut_off(self.app, scope, receive, send, core)
        finally:
            core.free_slot()


async def _until_cut_off(app, scope, receive, send, core: RouterCore) -> None:
    """`app`'s answer to the request, unless the service cuts it off first (`core.cut_off`: its drain timed out).
    Then the answer is cancelled (the dispatcher aborts the request's legs on the engines) and the client still gets
    an end, never a dropped connection: a 503 error object, or, in a stream already running, an `event: error` and
    [DONE] (the openai client raises it as an APIError, AIPerf records an error)."""
    response: dict[str, bool] = {}

    async def tracked(message: dict) -> None:
        if message["type"] == "http.response.start":
            response["sse"] = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                  for k, v in message.get("headers", []))
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            response["ended"] = True
        await send(message)

    work = asyncio.ensure_future(app(scope, receive, tracked))
    cut = asyncio.ensure_future(core.cut_off.wait())
    try:
        await asyncio.wait((work, cut), return_when=asyncio.FIRST_COMPLETED)
        cut_first = not work.done()
    finally:
        cut.cancel()
        if not work.done():  # cut off, or we were cancelled ourselves
            work.cancel()
    if not cut_first:
        await work  # its answer was sent, or its exception goes on
        return
    await asyncio.gather(work, return_exceptions=True)
    if response.get("ended"):
        return
    message = f"{core.stopping or 'the service stops'}: cut off after the drain timeout, not finished"
    if "sse" not in response:
        await error_response(503, message, code="shutting_down")(scope, receive, send)
        return
    event = sse_error_event(error_object(503, message, code="shutting_down")) + SSE_DONE
    await send({"type": "http.response.body", "body": event if response["sse"] else b"", "more_body": False})


OPEN_PATHS = frozenset({"/health"})  # a load balancer's probe needs no key (SGLang's --api-key leaves it open too)


class ApiKeyGate:
    """ASGI wrapper: with router.api_key_env set, every request but /health must carry 'Authorization: Bearer <key>'
    or is answered 401 before its body is read: a caller without the key learns nothing of the API, takes no
    in-flight slot and is not counted as a rejected inference request."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        core = getattr(scope["app"].state, "core", None) if scope["type"] == "http" else None
        if core is None or core.api_key is None or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        got = dict(scope["headers"]).get(b"authorization", b"")
        if secrets.compare_digest(got, f"Bearer {core.api_key}".encode()):
            await self.app(scope, receive, send)
            return
        message = ("missing or wrong API key: send 'Authorization: Bearer <key>' "
                   f"(the key is in ${core.cfg.router.api_key_env} where the router runs)")
        await error_response(401, message, code="invalid_api_key")(scope, receive, send)


def http_error_response(exc: HTTPError) -> JSONResponse:
    return FastJSONResponse(client_error_object(exc.status, exc.message, exc.body, exc.code), exc.status)


async def generate_route(core: RouterCore, body: GenerateBody) -> Response:
    engine_body = await core.to_input_ids(body)
    if body.stream:
        relay = await core.open_stream(engine_body)
        return StreamingResponse(_relayed(relay), media_type="text/event-stream")
    return FastJSONResponse(await core.generate(engine_body))


async def _relayed(relay) -> AsyncIterator[bytes]:
    """The decode's SGLang events byte for byte, then the relay's ending ([DONE], or an `event: error` first)."""
    async for data in relay.chunks():
        yield data
    yield relay.ending()


Endpoint = Callable[[RouterCore, Any], Awaitable[Response]]
INFERENCE_ROUTES: dict[str, tuple[type[BaseModel], Endpoint]] = {
    "/generate": (GenerateBody, generate_route),
    "/v1/completions": (CompletionBody, openai.completions),
    "/v1/chat/completions": (ChatBody, openai.chat_completions),
}


def _json_content(scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


class InferenceFastPath:
    """ASGI wrapper, innermost of ours: a POST of a JSON object to an inference path is validated and answered here,
    skipping FastAPI's routing, dependency solving and body handling (about a quarter of the gateway's CPU per
    request, docs/performance.md "Router overhead"). Everything else (another content type, a body that orjson
    cannot read or that is not an object, other paths) goes on to FastAPI with its body replayed, so every answer,
    errors included, is the one FastAPI's routes give."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        core = getattr(scope["app"].state, "core", None) if scope["type"] == "http" else None
        route = INFERENCE_ROUTES.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if core is None or route is None or not _json_content(scope):
            await self.app(scope, receive, send)
            return
        messages, body = [], []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            data = orjson.loads(b"".join(body)) if messages[-1]["type"] == "http.request" else None
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            await self.app(scope, _replay(messages, receive), send)
            return
        model, endpoint = route
        try:
            response = await _unless_client_leaves(endpoint(core, model.model_validate(data)), receive)
        except ValidationError as exc:
            errors = exc.errors()
            response = error_response(400, invalid_body_message(errors), invalid_field(errors))
        except HTTPError as exc:
            response = http_error_response(exc)
        if response is None:
            return  # the client left: its request was cancelled, which aborts both legs on the engines
        await response(scope, receive, send)


async def _unless_client_leaves(answer: Awaitable[Response], receive) -> Response | None:
    """`answer`, or None once the client disconnects first: the answer is then cancelled (the dispatcher aborts the
    request's legs), as SGLang aborts a request whose client left instead of generating to its max_tokens. A stream
    returns its response at once; its relay watches the client from there."""
    work = asyncio.ensure_future(answer)
    left = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((work, left), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done() and not left.done():  # we were cancelled ourselves
            work.cancel()
        left.cancel()
    if work.done():
        return work.result()
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return None


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _replay(messages: list[dict], receive):
    pending = list(messages)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()

    return replayed


# FastAPI >= 0.16x looks up OpenTelemetry's global providers on every request unless told not to; the router
# reports through Prometheus (RouterMetrics)
NO_TELEMETRY: dict[str, Any] = ({"telemetry": {"tracing": False, "metrics": False, "logs": False}}
                if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


def build_http_app() -> FastAPI:
    """The ingress routes over the RouterCore in `app.state.core` (the wrappers above read it there too)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        core = getattr(app.state, "core", None)
        if core is not None:  # close pooled engine connections with the server
            await core.dispatcher.close()

    app = FastAPI(title="pd-orchestrator router", docs_url=None, redoc_url=None, lifespan=lifespan, **NO_TELEMETRY)
    app.add_middleware(InferenceFastPath)
    app.add_middleware(InFlightLimit)
    app.add_middleware(ApiKeyGate)  # added last = outermost: the key is checked before a slot is taken

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()  # the sim engine's words for /generate; `param` names the field as OpenAI does
        return error_response(400, invalid_body_message(errors), invalid_field(errors))

    @app.exception_handler(HTTPError)
    async def _http_error(_request: Request, exc: HTTPError) -> JSONResponse:
        return http_error_response(exc)

    async def authorised(core: RouterCore = Depends(core_in_app_state)) -> RouterCore:
        return core  # the key was checked by ApiKeyGate before the body was read

    @app.get("/health")
    async def health(core: RouterCore = Depends(core_in_app_state)) -> Response:
        if core.stopping is not None:  # a load balancer in front takes this gateway out while it drains
            return error_response(503, f"{core.stopping}: draining, no new requests", code="shutting_down")
        counts = core.ready_counts()
        missing = [role for role, n in counts.items() if n == 0]
        if missing:
            return error_response(503, f"no healthy {' or '.join(missing)} worker yet (healthy: {counts})",
                                  code="no_worker")
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
        return await generate_route(core, body)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, core: RouterCore = Depends(authorised)) -> Response:
        return await openai.completions(core, body)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody, core: RouterCore = Depends(authorised)) -> Response:
        return await openai.chat_completions(core, body)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(core: RouterCore = Depends(authorised)) -> dict:
        out: dict[str, int | str] = {}  # worker -> HTTP status, or the error
        for w in core.dispatcher.workers.values():
            try:
                async with core.dispatcher.session.post(w.endpoint.url + "/flush_cache") as r:
                    out[w.name] = r.status
            except Exception as exc:
                out[w.name] = repr(exc)
        return out

    return app


def listening_socket(host: str, port: int) -> socket.socket:
    """host:port bound and listening, SO_REUSEPORT so router replicas on one node share the port (the kernel
    spreads connections over them); a taken port is one line naming router.port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto says TCP. Without it Nagle
    # held a response's body until the client ACKed its headers (a delayed ACK: ~40 ms per request at 1 in flight)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # from here connections wait in the backlog until the server accepts them
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"router.host:router.port = {host}:{port}: cannot listen ({exc.strerror}); "
                           "free the port or set router.port to another one") from None
    return sock


async def serve_http(core: RouterCore, host: str, port: int) -> tuple[uvicorn.Server, asyncio.Task]:
    """Serve the ingress for `core` on host:port from the running event loop; returns once it listens.

    Stop with `server.should_exit = True` and await the task (it closes the pooled engine connections).
    """
    app = build_http_app()
    app.state.core = core
    sock = listening_socket(host, port)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", http="httptools",
                            backlog=2048, timeout_keep_alive=75)
    server = uvicorn.Server(config)
    return server, asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
