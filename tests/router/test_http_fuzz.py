"""The router's HTTP ingress under fuzzed input: invalid bodies get a 4xx with a message, never a 500,
never a hung connection; oversized prompts are rejected with the limit named.

The ingress app (the same FastAPI object Serve wraps) is served by uvicorn on loopback in front of a real
simulated prefill + decode pair, so a fuzzed body that happens to be valid really runs through both
engines. Hypothesis drives four suites: arbitrary JSON bodies, valid bodies with one field replaced by a
wrong value, raw bytes, and oversized prompts. Every request has a client timeout: a hang fails the test.
The session summary lists how many cases each suite sent and which statuses came back (docs/reliability.md).
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import Ingress, log_case, router_core

MAX_PROMPT_TOKENS = 256
CLIENT_TIMEOUT_S = 30.0  # far above any answer these small requests need: hitting it means a hang
POST_PATHS = ("/generate", "/v1/completions", "/v1/chat/completions")
GET_PATHS = ("/health", "/v1/models", "/server_info", "/model_info")

# A valid small body per endpoint; the "one wrong field" suite breaks exactly one field of these.
VALID = {
    "/generate": {"input_ids": [11, 12, 13], "sampling_params": {"max_new_tokens": 2, "ignore_eos": True},
                  "stream": False},
    "/v1/completions": {"model": "m", "prompt": "Hello there", "max_tokens": 2, "temperature": 0,
                        "stream": False},
    "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                             "stream": False},
}
FIELDS = {
    "/generate": ["text", "input_ids", "sampling_params", "stream", "rid", "return_logprob", "bootstrap_room"],
    "/v1/completions": ["model", "prompt", "max_tokens", "temperature", "top_p", "stop", "n", "stream",
                        "stream_options", "ignore_eos", "seed"],
    "/v1/chat/completions": ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                             "stop", "n", "stream", "stream_options", "ignore_eos", "seed"],
}
SAMPLING_KEYS = ["max_new_tokens", "temperature", "top_p", "top_k", "ignore_eos", "stop", "min_new_tokens",
                 "frequency_penalty", "n"]


@pytest.fixture(scope="module")
def ingress(pd_workers):
    server = Ingress(router_core(pd_workers, max_prompt_tokens=MAX_PROMPT_TOKENS))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(ingress):
    with httpx.Client(base_url=ingress.url, timeout=CLIENT_TIMEOUT_S) as client:
        yield client


def error_message(resp: httpx.Response) -> str:
    """The message of an error answer, in our shape or SGLang's (passed through from an engine)."""
    try:
        body = resp.json()
    except ValueError:
        return ""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or "")
        return str(err or body.get("message") or body.get("detail") or "")
    return ""


def send(http: httpx.Client, suite: str, method: str, path: str, **kwargs) -> httpx.Response:
    """One fuzz case: the whole answer (a stream is read to its end) within the client timeout."""
    try:
        with http.stream(method, path, **kwargs) as resp:
            resp.read()
    except httpx.TimeoutException:
        pytest.fail(f"{method} {path} hung (no full answer within {CLIENT_TIMEOUT_S:.0f}s): {kwargs!r:.300}")
    log_case(f"HTTP fuzz: {suite}", str(resp.status_code))
    return resp


def check_answer(resp: httpx.Response, what: str) -> None:
    """Never a server error; an error answer is a 4xx that says what is wrong."""
    assert resp.status_code < 500, f"{what} -> {resp.status_code} {resp.text[:300]}"
    if resp.status_code >= 400:
        assert error_message(resp).strip(), f"{what} -> {resp.status_code} without a message: {resp.text[:300]}"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=12,
)
FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(path=st.sampled_from(POST_PATHS), body=json_values)
def test_arbitrary_json_bodies(http, path, body):
    resp = send(http, "arbitrary JSON", "POST", path, json=body)
    check_answer(resp, f"POST {path} {json.dumps(body)[:200]}")


@FUZZ
@given(data=st.data(), path=st.sampled_from(POST_PATHS))
def test_valid_bodies_with_one_wrong_field(http, data, path):
    body = json.loads(json.dumps(VALID[path]))
    field = data.draw(st.sampled_from(FIELDS[path] + ["sampling_params." + k for k in SAMPLING_KEYS]
                                      if path == "/generate" else FIELDS[path]))
    value = data.draw(json_values)
    if field.startswith("sampling_params."):
        body["sampling_params"][field.split(".", 1)[1]] = value
    else:
        body[field] = value
    resp = send(http, "one wrong field", "POST", path, json=body)
    check_answer(resp, f"POST {path} with {field}={json.dumps(value)[:150]}")


@FUZZ
@given(path=st.sampled_from(POST_PATHS), raw=st.binary(max_size=200),
       content_type=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""]))
def test_raw_bytes_bodies(http, path, raw, content_type):
    headers = {"content-type": content_type} if content_type else {}
    resp = send(http, "raw bytes", "POST", path, content=raw, headers=headers)
    check_answer(resp, f"POST {path} ({content_type or 'no content-type'}) {raw[:80]!r}")


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(POST_PATHS), extra=st.integers(min_value=1, max_value=4 * MAX_PROMPT_TOKENS),
       as_text=st.booleans(), stream=st.booleans())
def test_oversized_prompts_are_rejected_naming_the_limit(http, path, extra, as_text, stream):
    n = MAX_PROMPT_TOKENS + extra
    if path == "/generate":
        body = {"text": "word " * n} if as_text else {"input_ids": [5] * n}
        body["stream"] = stream
    elif path == "/v1/completions":
        body = {"model": "m", "prompt": "word " * n if as_text else [5] * n, "max_tokens": 1, "stream": stream}
    else:
        body = {"model": "m", "messages": [{"role": "user", "content": "word " * n}], "max_tokens": 1,
                "stream": stream}
    resp = send(http, "oversized prompt", "POST", path, json=body)
    assert resp.status_code == 400, f"POST {path} with a {n}-token prompt -> {resp.status_code} {resp.text[:200]}"
    assert f"router.max_prompt_tokens={MAX_PROMPT_TOKENS}" in error_message(resp)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(GET_PATHS + POST_PATHS), method=st.sampled_from(["GET", "PUT", "DELETE", "PATCH"]),
       query=st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3))
def test_other_methods_and_query_strings(http, path, method, query):
    resp = send(http, "methods + query strings", method, path, params=query)
    assert resp.status_code < 500, f"{method} {path}?{query} -> {resp.status_code} {resp.text[:200]}"
