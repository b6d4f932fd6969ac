"""The gateway's refusals as an OpenAI client meets them: a malformed or incomplete body is a 400 whose error object
has OpenAI's shape and names the field (message and `param`); an engine's own 4xx comes in the same shape with the
engine's message; `code` is a string slug or null as OpenAI and sglang-router send it (never the HTTP status as an
int, which SGLang 0.5.17's own server sends and the Java/.NET OpenAI SDKs fail to read); without the API key, or with
a wrong one, a 401 comes before the body is even read; the default gateway listens on loopback only.

The ingress app is served by uvicorn on loopback in front of two simulated engine servers (tests/support.py)."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import openai
import pytest

from orchestrator.config.schema import RouterConfig
from tests.support import Ingress, router_core

OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
COMPLETION = {"model": "m", "prompt": [1, 2], "max_tokens": 1}


@pytest.fixture(scope="module")
def ingress(pd_workers):
    server = Ingress(router_core(pd_workers))
    yield server
    server.stop()


def openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    """The error object of a refusal, checked against OpenAI's shape (`code` a string slug or null)."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == code, body
    return body["error"]


@pytest.mark.parametrize("path", OPENAI_PATHS)
def test_a_body_that_is_not_json_is_a_400_saying_so(ingress, path):
    r = httpx.post(ingress.url + path, content=b'{"messages": [', headers={"content-type": "application/json"},
                   timeout=30)
    error = openai_error(r, 400)
    assert error["message"].startswith("invalid request: body is not valid JSON") and error["param"] is None


@pytest.mark.parametrize("path, body, field, says", [
    ("/v1/chat/completions", {"model": "m"}, "messages", "required, not sent"),
    ("/v1/completions", {"model": "m", "max_tokens": 1}, "prompt", "required, not sent"),
    ("/v1/chat/completions", {"model": "m", "messages": "hi"}, "messages", "valid list"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, "max_tokens",
     "valid integer"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature",
     "valid number"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": [1]}, "stream",
     "valid boolean"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "messages.0.role", "required, not sent"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1.5}, "max_tokens", "integer"),
    ("/v1/completions", {"prompt": "x", "ignore_eos": "sometimes"}, "ignore_eos", "valid boolean"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True}, "logprobs",
     "not served by this gateway"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     "tools", "not served by this gateway"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_object"}}, "response_format", "not served"),
    ("/v1/completions", {"prompt": "x", "echo": True}, "echo", "not served by this gateway"),
    ("/v1/completions", {"prompt": "x", "logprobs": 2}, "logprobs", "not served by this gateway"),
    ("/v1/completions", {"prompt": "x", "frequency_penalty": 3}, "frequency_penalty", "less than or equal to 2"),
    ("/v1/completions", {"prompt": "x", "top_k": 0}, "top_k", "-1 (disabled) or at least 1"),
    # OpenAI refuses a zero budget (400, "Expected a value >= 1"), as SGLang's /v1/completions does; it was answered
    # with one token
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens", "at least 1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens",
     "at least 1"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
     "max_completion_tokens", "at least 1"),
])
def test_a_missing_or_mistyped_field_is_a_400_naming_it(ingress, path, body, field, says):
    error = openai_error(httpx.post(ingress.url + path, json=body, timeout=30), 400)
    assert error["param"] == field, error
    assert error["message"].startswith(f"invalid request: {field}: ") and says in error["message"], error


def test_the_openai_sdk_raises_bad_request_naming_the_field(ingress):
    client = openai.OpenAI(base_url=ingress.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                       extra_body={"max_tokens": "many"})
    assert refused.value.param == "max_tokens" and "max_tokens" in refused.value.message


ENGINE_REFUSES = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "min_tokens": 5}


@pytest.mark.parametrize("path", [*OPENAI_PATHS, "/generate"])
def test_a_json_body_sent_as_a_form_is_a_400_naming_the_content_type(ingress, path):
    """`curl -d '{...}'` without -H sends application/x-www-form-urlencoded; the answer names the header to send
    (it said 'send a JSON object (got bytes)' to a body that was one)."""
    r = httpx.post(ingress.url + path, content=json.dumps(COMPLETION).encode(),
                   headers={"content-type": "application/x-www-form-urlencoded"}, timeout=30)
    error = openai_error(r, 400)
    assert "send the header Content-Type: application/json" in error["message"] and error["param"] is None, error


@pytest.mark.parametrize("stream", [False, True])
def test_a_completion_longer_than_the_context_is_refused_at_once_with_sglangs_words(ingress, stream):
    """Prompt + max_tokens over the engines' context length: the engine's 400 comes back through the gateway,
    at once (it was generated until the KV pool's cap: minutes for a serve user's max_tokens=100000)."""
    body = {**CHAT, "max_tokens": 10**6, "stream": stream}
    error = openai_error(httpx.post(ingress.url + "/v1/chat/completions", json=body, timeout=30), 400)
    assert "exceeds the model's maximum context length of" in error["message"], error


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", ENGINE_REFUSES),
    ("/v1/completions", {"prompt": [1, 2], "max_tokens": 1, "min_tokens": 5}),
])
def test_an_engines_own_400_reaches_the_client_in_openais_shape_with_the_engines_message(ingress, path, body, stream):
    """The gateway lets min_tokens > max_tokens through (SGLang answers it, not a silent clamp); the engine's
    `{"error": {"message"}}` comes back with type, param and code, as the gateway's own errors."""
    error = openai_error(httpx.post(ingress.url + path, json={**body, "stream": stream}, timeout=30), 400)
    assert error["message"] == ("invalid request: sampling_params: min_new_tokens (5) must not exceed "
                                "max_new_tokens (1)"), error
    assert error["param"] is None


def test_the_openai_sdk_reads_an_engines_400(ingress):
    client = openai.OpenAI(base_url=ingress.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="m", messages=ENGINE_REFUSES["messages"], max_tokens=1,
                                       extra_body={"min_tokens": 5})
    assert refused.value.type == "invalid_request_error" and refused.value.code is None
    assert "min_new_tokens (5) must not exceed max_new_tokens (1)" in refused.value.message


def test_a_prompt_over_the_limit_is_context_length_exceeded(pd_workers):
    server = Ingress(router_core(pd_workers, max_prompt_tokens=4))
    try:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": [1, 2, 3, 4, 5], "max_tokens": 1}, timeout=30)
        error = openai_error(r, 400, "context_length_exceeded")
        assert "5 tokens, more than router.max_prompt_tokens=4" in error["message"]
    finally:
        server.stop()


@pytest.mark.parametrize("engine_body, message, param, code", [
    ({"error": {"message": "too long"}}, "too long", None, None),  # SGLang /generate's _create_error_response
    ({"object": "error", "message": "bad", "type": "Bad Request", "param": None, "code": 400}, "bad", None, None),
    ({"error": {"message": "x", "type": "BadRequestError", "param": "max_tokens", "code": "n"}}, "x", "max_tokens", "n"),
    ({"detail": "odd"}, "odd", None, None),
    ("plain text", "plain text", None, None),
])
def test_engine_error_bodies_of_every_shape_become_openais(engine_body, message, param, code):
    from orchestrator.router.dispatch.failures import engine_error_object

    assert engine_error_object(400, engine_body) == {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION), ("/generate", {"input_ids": [1]}),
    ("/v1/chat/completions", b'{"messages": ['), ("/v1/chat/completions", {"model": "m"}),
])
def test_without_or_with_a_wrong_key_every_request_is_a_401_before_its_body_is_read(pd_workers, monkeypatch, path,
                                                                                     body):
    monkeypatch.setenv("PDORCH_GATEWAY_KEY", "k-3f9a")
    server = Ingress(router_core(pd_workers, api_key_env="PDORCH_GATEWAY_KEY"))
    try:
        def post(headers: dict[str, str]) -> httpx.Response:
            kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
            return httpx.post(server.url + path, headers={"content-type": "application/json", **headers},
                              timeout=30, **kwargs)

        for headers in ({}, {"Authorization": "Bearer k-3f9"}, {"Authorization": "k-3f9a"}):
            error = openai_error(post(headers), 401, "invalid_api_key")
            assert "missing or wrong API key" in error["message"] and "$PDORCH_GATEWAY_KEY" in error["message"]
            assert "k-3f9a" not in error["message"]
        assert server.core.in_flight == 0 and server.core.rejected == 0  # refused before taking a slot
        right = post({"Authorization": "Bearer k-3f9a"})
        assert right.status_code == (200 if body in (CHAT, COMPLETION, {"input_ids": [1]}) else 400), right.text
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200  # a probe needs no key
    finally:
        server.stop()


def test_the_gateway_listens_on_loopback_unless_configured(pd_workers):
    from orchestrator.router.http_app import serve_http

    assert RouterConfig().host == "127.0.0.1"
    core = router_core(pd_workers)
    others = [ip for ip in socket.gethostbyname_ex(socket.gethostname())[2] if not ip.startswith("127.")]

    async def reachable(host: str, port: int) -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
        except OSError:
            return False
        writer.close()
        return True

    async def serving() -> tuple[tuple[str, int], dict[str, bool]]:
        server, task = await serve_http(core, core.cfg.router.host, 0)
        try:
            while not server.started:  # uvicorn fills server.servers during its start-up
                await asyncio.sleep(0.01)
            host, port = server.servers[0].sockets[0].getsockname()[:2]
            return (host, port), {ip: await reachable(ip, port) for ip in ["127.0.0.1", *others]}
        finally:
            server.should_exit = True
            await task

    (host, port), reached = asyncio.run(serving())
    assert host == "127.0.0.1" and port > 0
    assert reached == {"127.0.0.1": True, **{ip: False for ip in others}}, reached


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": "m"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}),
    ("/v1/chat/completions", ENGINE_REFUSES),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1.5}),
    ("/v1/completions", {"prompt": [1, 2], "max_tokens": 1, "stream": True, "n": 2}),
    ("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}),
    ("/generate", {"text": "a", "input_ids": [1]}),
    ("/generate", {"input_ids": [[1], [2]], "rid": ["a"]}),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}),
])
def test_the_fast_inference_path_answers_as_fastapis_routes(ingress, path, body):
    """A JSON POST to an inference path is answered by InferenceFastPath; the same body under another JSON media type
    goes through FastAPI's own route: status and body are the same (a success differs only in the generated text's
    ids, so the answers' keys and token counts are compared)."""
    fast, routed = (httpx.post(ingress.url + path, content=json.dumps(body), timeout=30, headers={"content-type": ct})
                    for ct in ("application/json", "application/merge-patch+json"))
    assert fast.status_code == routed.status_code, (fast.text, routed.text)
    if fast.status_code != 200:
        assert fast.json() == routed.json()
    else:
        assert fast.json().keys() == routed.json().keys()
        assert fast.json()["meta_info"]["completion_tokens"] == routed.json()["meta_info"]["completion_tokens"] == 2
