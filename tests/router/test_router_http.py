"""The router's HTTP ingress, as standard clients use it: openai client, SGLang-style /generate, errors, API key.

Most tests serve the ingress app with uvicorn on loopback in front of two simulated engine servers
(no Ray: the app is the same FastAPI object Serve wraps). The last test deploys the whole thing on the
session's local Ray cluster: worker deployments, registry, PDRouter serving HTTP on router.port itself.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest

from orchestrator.records import BenchRequest
from orchestrator.router.core import RouterCore
from tests.support import Ingress, router_core, sim_config, wait_until


@pytest.fixture(scope="module")
def ingress(pd_workers):
    server = Ingress(router_core(pd_workers, max_prompt_tokens=512))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(ingress) -> openai.OpenAI:
    return openai.OpenAI(base_url=ingress.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def sse_events(raw: str) -> list:
    events = [e.strip()[5:].strip() for e in raw.split("\n\n") if e.strip().startswith("data:")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def test_openai_completion(client):
    out = client.completions.create(model="m", prompt="The capital of France is", max_tokens=6,
                                    extra_body={"ignore_eos": True})
    assert out.object == "text_completion"
    assert out.usage.completion_tokens == 6 and out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens > 1  # counted by the faithful tokenizer, BOS included


def test_openai_completion_stream_with_usage(client):
    chunks = list(client.completions.create(model="m", prompt=[1, 2, 3, 4], max_tokens=5, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].usage.prompt_tokens == 4


def test_openai_chat(client):
    out = client.chat.completions.create(
        model="m", max_tokens=4, extra_body={"ignore_eos": True},
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}])
    assert out.choices[0].message.role == "assistant"
    assert isinstance(out.choices[0].message.content, str)
    assert out.usage.completion_tokens == 4


def test_openai_chat_stream(client):
    stream = client.chat.completions.create(model="m", max_tokens=4, stream=True, extra_body={"ignore_eos": True},
                                            messages=[{"role": "user", "content": "Hi"}])
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["DeepSeek-R1"]


def test_generate_with_input_ids_returns_the_engine_answer(ingress):
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}
    r = httpx.post(ingress.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["output_ids"]) == 3 and out["meta_info"]["completion_tokens"] == 3


def test_generate_text_is_sent_as_faithful_token_ids(ingress):
    text = "Hello world, hello router."
    r = httpx.post(ingress.url + "/generate", timeout=60,
                   json={"text": text, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    expected = asyncio.run(ingress.core.encode(text))
    assert r.json()["meta_info"]["prompt_tokens"] == len(expected)


def test_generate_stream_relays_sse_to_done(ingress):
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}, "stream": True}
    with httpx.stream("POST", ingress.url + "/generate", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.read().decode())
    assert events[-1] == "[DONE]"
    assert events[-2]["meta_info"]["completion_tokens"] == 4


@pytest.mark.parametrize("path, body, field", [
    ("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": "many"}}, "max_new_tokens"),
    ("/generate", {"sampling_params": {}}, "text, input_ids: send exactly one of them"),
    ("/generate", {"input_ids": "abc"}, "input_ids"),
    ("/generate", {"input_ids": []}, "at least one token id"),
    ("/v1/completions", {"model": "m"}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
])
def test_invalid_bodies_get_400_naming_the_field(ingress, path, body, field):
    r = httpx.post(ingress.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"]


@pytest.mark.parametrize("body", [
    {}, {"input_ids": ["a"]}, {"input_ids": [1], "sampling_params": {"top_p": 2.0}},
    {"input_ids": [[1], [2]], "sampling_params": [{}]}, {"text": "x", "stream": "yes"}, [1, 2],
    {"input_ids": [1], "sampling_params": {"n": 2}},
])
def test_router_and_sim_refuse_a_bad_body_with_the_same_message(ingress, pd_workers, body):
    """One body model (orchestrator.api.generate) behind both: the same refusal, word for word."""
    decode_url = next(e.url for e in pd_workers if e.role == "decode")
    via_router = httpx.post(ingress.url + "/generate", json=body, timeout=30)
    at_engine = httpx.post(decode_url + "/generate", json=body, timeout=30)
    assert via_router.status_code == at_engine.status_code == 400, (via_router.text, at_engine.text)
    assert via_router.json()["error"]["message"] == at_engine.json()["error"]["message"]


def test_per_prompt_sampling_params_of_a_batch_are_served(ingress):
    body = {"input_ids": [[1, 2], [3, 4, 5]], "sampling_params": [
        {"max_new_tokens": 2, "ignore_eos": True}, {"max_new_tokens": 3, "ignore_eos": True}]}
    r = httpx.post(ingress.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert [o["meta_info"]["completion_tokens"] for o in r.json()] == [2, 3]


def test_a_passed_through_integer_beyond_64_bits_is_relayed_not_a_500(ingress):
    # orjson refuses such integers; the router's body encoder falls back to the json module for them
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}, "x_tag": 2 ** 70}
    r = httpx.post(ingress.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 2


def test_body_that_is_not_json_gets_400(ingress):
    r = httpx.post(ingress.url + "/generate", content=b"{not json", headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 400 and "invalid request" in r.json()["error"]["message"]


def test_oversized_prompt_is_rejected_naming_the_limit(ingress, client):
    r = httpx.post(ingress.url + "/generate", json={"input_ids": list(range(600))}, timeout=30)
    assert r.status_code == 400
    assert "600 tokens, more than router.max_prompt_tokens=512" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="router.max_prompt_tokens=512"):
        client.completions.create(model="m", prompt="word " * 600, max_tokens=1)


def test_health_and_merged_server_info(ingress):
    assert httpx.get(ingress.url + "/health", timeout=30).status_code == 200
    info = httpx.get(ingress.url + "/server_info", timeout=30).json()
    assert [i["worker"] for i in info["prefill"]] == ["sim-prefill"]
    assert [i["worker"] for i in info["decode"]] == ["sim-decode"]
    assert info["internal_states"]


def test_health_is_503_without_workers():
    server = Ingress(router_core([]))
    try:
        r = httpx.get(server.url + "/health", timeout=30)
        assert r.status_code == 503 and "no healthy prefill or decode worker" in r.json()["error"]["message"]
        r = httpx.post(server.url + "/generate", json={"input_ids": [1]}, timeout=30)
        assert r.status_code == 503 and "no healthy prefill worker" in r.json()["error"]["message"]
    finally:
        server.stop()


def test_api_key_is_required_when_configured(pd_workers, monkeypatch):
    monkeypatch.setenv("PDORCH_TEST_KEY", "s3cret")
    server = Ingress(router_core(pd_workers, api_key_env="PDORCH_TEST_KEY"))
    try:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 1}, timeout=30)
        assert r.status_code == 401 and "Authorization: Bearer" in r.json()["error"]["message"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model="m", prompt=[1, 2], max_tokens=1).usage.completion_tokens == 1
    finally:
        server.stop()


def test_api_key_env_that_is_unset_is_a_clear_startup_error(pd_workers, monkeypatch):
    monkeypatch.delenv("PDORCH_MISSING_KEY", raising=False)
    with pytest.raises(ValueError, match=r"router.api_key_env='PDORCH_MISSING_KEY' but \$PDORCH_MISSING_KEY is empty"):
        router_core(pd_workers, api_key_env="PDORCH_MISSING_KEY")


# ---- the whole Serve application on the local Ray cluster -------------------------------------------------


@pytest.mark.ray
def test_serve_app_handle_batch_and_http_ingress(ray_driver, make_sim_config):
    from ray import serve

    from deployments.app import ROUTER_APP, deploy, expected_workers

    cfg = make_sim_config()
    run_id = f"router-test-{int(time.time())}"
    deploy(cfg, run_id, timeout_s=120)
    try:
        router = serve.get_app_handle(ROUTER_APP)
        ready = router.wait_ready.remote(expected_workers(cfg), 90).result(timeout_s=120)
        assert sorted(e.role for e in ready) == ["decode", "prefill"]

        reqs = [BenchRequest(index=i, input_ids=list(range(1, 20 + i)), output_len=6) for i in range(10)]
        gen = router.options(stream=True).generate_batch.remote(reqs, 4, time.time() + 120)
        results = list(gen)
        assert sorted(r.index for r in results) == list(range(10))
        assert all(r.status == "ok" and r.completion_tokens == 6 for r in results), [r.error for r in results]

        url = f"http://127.0.0.1:{cfg.router.port}"
        wait_until(lambda: httpx.get(url + "/health", timeout=10).status_code == 200, 60)
        out = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0).chat.completions.create(
            model="m", max_tokens=3, messages=[{"role": "user", "content": "hi"}], extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 3
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}, "stream": True}
        with httpx.stream("POST", url + "/generate", json=body, timeout=60) as r:
            assert sse_events(r.read().decode())[-1] == "[DONE]"
    finally:
        serve.shutdown()


def test_http_requests_feed_the_router_metrics_like_the_batch_api(pd_workers):
    """/generate (single, batched, streamed) and the OpenAI APIs count in RouterMetrics: one request per
    prompt, tokens per worker, failures by reason, nothing left in flight."""
    from prometheus_client import CollectorRegistry

    from orchestrator.observe.metrics import RouterMetrics

    metrics = RouterMetrics("http-run", "1P1D", CollectorRegistry())
    cfg = sim_config({"model": {"preset": "DeepSeek-R1", "quantization": "fp8"},
                      "router": {"max_attempts": 2}})
    core = RouterCore(cfg, run_id="http-run", metrics=metrics)
    core.follow(1, pd_workers)
    server = Ingress(core)
    decode_url = next(e.url for e in pd_workers if e.role == "decode")
    base = {"run_id": "http-run", "layout": "1P1D"}
    sent_prompt_tokens = sent_output_tokens = 0
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            single = http.post("/generate", json={"input_ids": [5, 6, 7], "sampling_params": {
                "max_new_tokens": 3, "ignore_eos": True}})
            batched = http.post("/generate", json={"input_ids": [[1, 2], [3, 4, 5, 6]], "sampling_params": {
                "max_new_tokens": 2, "ignore_eos": True}})
            streamed = http.post("/generate", json={"input_ids": [9, 9, 9, 9, 9], "stream": True,
                                                    "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
            chat = http.post("/v1/chat/completions", json={"model": "m", "max_tokens": 2, "ignore_eos": True,
                                                           "messages": [{"role": "user", "content": "Hi"}]})
            assert [r.status_code for r in (single, batched, streamed, chat)] == [200] * 4
            sent_prompt_tokens = 3 + 2 + 4 + 5 + chat.json()["usage"]["prompt_tokens"]
            sent_output_tokens = 3 + 2 + 2 + 4 + 2
            httpx.post(decode_url + "/sim/faults", json={"error_rate": 1.0}, timeout=10).raise_for_status()
            try:
                broken = http.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
            finally:
                httpx.post(decode_url + "/sim/faults", json={}, timeout=10).raise_for_status()
            assert broken.status_code == 500, broken.text
            # a stream is booked after its last byte went out, so its client may read [DONE] first
            wait_until(lambda: metrics.registry.get_sample_value("pdorch_requests_completed_total", base) == 5, 10,
                       0.02, what="every completed request booked")
    finally:
        server.stop()

    def value(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, {**base, **labels}) or 0.0

    assert value("pdorch_requests_completed_total") == 5  # single 1 + batched 2 + streamed 1 + chat 1
    assert value("pdorch_requests_failed_total", reason="http_500") == 1
    prefill, decode = (next(e.name for e in pd_workers if e.role == r) for r in ("prefill", "decode"))
    assert value("pdorch_input_tokens_total", role="prefill", worker=prefill) == sent_prompt_tokens
    assert value("pdorch_output_tokens_total", role="decode", worker=decode) == sent_output_tokens
    assert value("pdorch_e2e_seconds_count") == 5
    assert value("pdorch_ttft_seconds_count") == 1  # known only when streamed
    assert value("pdorch_kv_wait_seconds_count") == 5  # the stream's prefill leg answered beside it: counted too
    # every completed request is judged against the goodput SLA (AIPerf's request_count); only the streamed one (4
    # tokens) has a TTFT and an ITL, the others can never be good
    assert value("pdorch_itl_seconds_count") == 1 and value("pdorch_sla_judged_requests_total") == 5
    for state in ("queued", "prefill", "transferring", "decoding"):
        assert value("pdorch_requests_in_flight", state=state) == 0, state


def test_past_max_in_flight_requests_the_gateway_answers_503_with_the_reason_and_counts_it(pd_workers):
    import socket
    from urllib.parse import urlsplit

    from orchestrator.observe.metrics import RouterMetrics

    core = router_core(pd_workers, max_in_flight_requests=1)
    core.metrics = RouterMetrics("test", "1P/1D")
    server = Ingress(core)
    url = urlsplit(server.url)
    try:
        # a client whose body has not all arrived holds the one slot (a slot is taken on arrival)
        slow = socket.create_connection((url.hostname, url.port), timeout=30)
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\": [1, ")
        wait_until(lambda: core.in_flight == 1, 30, 0.02, what="the slow request holding its slot")
        busy = httpx.post(server.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 1}, timeout=30)
        assert busy.status_code == 503, busy.text
        assert "router.max_in_flight_requests=1" in busy.json()["error"]["message"]
        assert busy.json()["error"]["code"] == "gateway_busy" and busy.json()["error"]["type"] == "server_error"
        assert httpx.get(server.url + "/health", timeout=30).status_code == 200  # not an inference request
        rejected = core.metrics.registry.get_sample_value(
            "pdorch_requests_rejected_total", {"run_id": "test", "layout": "1P/1D", "reason": "queue_full"})
        assert rejected == 1
        slow.close()  # the client goes away: its slot is freed
        wait_until(lambda: core.in_flight == 0, 30, 0.02, what="the slot freed")
        ok = httpx.post(server.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 1}, timeout=60)
        assert ok.status_code == 200, ok.text
    finally:
        server.stop()


def test_the_gateways_good_fraction_counts_what_aiperf_counts(pd_workers):
    """Over real HTTP: streamed and plain chats answered, one failed by the decode (500), one refused at the gateway
    (503 gateway_busy), one whose client leaves mid-stream. AIPerf's good_request_fraction divides by every answered
    and every errored request (a status outside 2xx is an error record) and keeps no record of a request its client
    cancelled; the gateway's counters give that same denominator and so the fraction AIPerf would report."""
    import socket
    from urllib.parse import urlsplit

    from orchestrator.config.benchmark import good_request_fraction
    from orchestrator.observe.metrics import RouterMetrics

    core = router_core(pd_workers, max_in_flight_requests=1)
    core.metrics = RouterMetrics("test", "1P/1D")
    server = Ingress(core)
    decode_url = next(e.url for e in pd_workers if e.role == "decode")
    chat = {"model": "m", "max_tokens": 4, "ignore_eos": True, "messages": [{"role": "user", "content": "Hi"}]}
    statuses: list[int] = []  # what an AIPerf client sees: 2xx with content is valid, anything else an error record

    def counted(name: str, **labels: str) -> float:
        return core.metrics.registry.get_sample_value(name, {"run_id": "test", "layout": "1P/1D", **labels}) or 0.0

    def slot_free() -> None:  # a stream's slot is given back just after its last byte
        wait_until(lambda: core.in_flight == 0, 30, 0.02, what="the gateway's one slot free")

    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for stream in (True, True, False):
                r = http.post("/v1/chat/completions", json={**chat, "stream": stream})
                assert r.status_code == 200 and "choices" in r.text, r.text
                statuses.append(r.status_code)
                slot_free()
            httpx.post(decode_url + "/sim/faults", json={"error_rate": 1.0}, timeout=10).raise_for_status()
            try:
                statuses.append(http.post("/v1/chat/completions", json=chat).status_code)
            finally:
                httpx.post(decode_url + "/sim/faults", json={}, timeout=10).raise_for_status()
            assert statuses[-1] == 500
            slot_free()
            # a client whose body has not all arrived holds the one slot: the next request is refused with a 503
            url = urlsplit(server.url)
            slow = socket.create_connection((url.hostname, url.port), timeout=30)
            slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"messages\": [")
            wait_until(lambda: core.in_flight == 1, 30, 0.02, what="the slow request holding its slot")
            statuses.append(http.post("/v1/chat/completions", json=chat).status_code)
            assert statuses[-1] == 503
            slow.close()
            slot_free()
            # the client leaves after its first chunk: no record for AIPerf (it cancels what it holds at the end)
            with http.stream("POST", "/v1/chat/completions",
                             json={**chat, "stream": True, "max_tokens": 100_000}) as r:
                assert r.status_code == 200 and next(r.iter_lines()).startswith("data: ")
        wait_until(lambda: counted("pdorch_requests_failed_total", reason="cancelled") == 1, 30, 0.05,
                   what="the request whose client left counted as such")
        wait_engines_free(core, pd_workers, "after the client left")
    finally:
        server.stop()

    valid = sum(1 for s in statuses if 200 <= s < 300)
    errored = len(statuses) - valid
    good = counted("pdorch_sla_good_requests_total")
    assert (valid, errored) == (3, 2)
    assert counted("pdorch_sla_judged_requests_total") == valid
    assert counted("pdorch_sla_attempted_requests_total") == valid + errored
    assert good <= 2  # the plain (not streamed) chat has no TTFT: never good
    assert good / counted("pdorch_sla_attempted_requests_total") == good_request_fraction(int(good), valid, errored)


def test_the_gateway_sends_without_waiting_for_the_clients_ack(pd_workers):
    """Every connection serve_http accepts has TCP_NODELAY: a response goes out in two writes (headers, body), and with
    Nagle on the body waited for the client's delayed ACK of the headers (~40 ms per request at 1 in flight)."""
    import asyncio
    import socket

    from orchestrator.router.http_app import serve_http

    core = router_core(pd_workers)

    async def accepted_nodelay() -> list[int]:
        server, task = await serve_http(core, "127.0.0.1", 0)
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            port = server.servers[0].sockets[0].getsockname()[1]
            async with httpx.AsyncClient() as client:
                assert (await client.get(f"http://127.0.0.1:{port}/health", timeout=30)).status_code == 200
                return [conn.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                        for conn in server.server_state.connections]
        finally:
            server.should_exit = True
            await task

    flags = asyncio.run(accepted_nodelay())
    assert flags and all(flags), flags


def wait_engines_free(core: RouterCore, workers, when: str) -> None:
    """Wait (10 s) until no engine holds a request; a failure names what each engine still holds and what the router
    did (a CI failure once said only `last: False`)."""
    from orchestrator.run.serving.warmup import busy_requests, engine_counts

    try:
        wait_until(lambda: busy_requests(workers) == 0, 10, 0.1, what=f"both engines free {when}")
    except AssertionError as exc:
        held = {w.name: engine_counts(w) for w in workers}
        raise AssertionError(f"{exc}; (requests counted, held) per engine: {held}; router in flight {core.in_flight}, "
                             f"aborts delivered {core.dispatcher.aborts_sent}") from None


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000,
                              "ignore_eos": True}),
    ("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 100_000, "ignore_eos": True}}),
])
def test_a_client_that_leaves_before_its_answer_frees_both_engines_at_once(ingress, pd_workers, path, body):
    """A non-streamed request whose client disconnects is aborted on the prefill and the decode, as SGLang aborts a
    request whose client left; it was generated on to its max_tokens (minutes here) with nobody to read it."""
    import socket
    from urllib.parse import urlsplit

    from orchestrator.run.serving.warmup import busy_requests

    url = urlsplit(ingress.url)
    payload = json.dumps(body).encode()
    client = socket.create_connection((url.hostname, url.port), timeout=30)
    client.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    wait_until(lambda: busy_requests(pd_workers) > 0, 30, 0.05, what="the engines holding the request")
    client.close()
    wait_engines_free(ingress.core, pd_workers, "after the client left")


def test_a_stopping_gateway_refuses_new_requests_and_ends_every_held_one_with_an_error(pd_workers):
    """`serve down` / SIGTERM: from the stop on, a new inference request is a 503 (`shutting_down`) and /health says
    so, while those in flight go on; once the drain times out, every request still held gets an end - a 503 error
    object, or in a running stream an error event and [DONE] - and both engines are freed. Before, the gateway kept
    admitting (a closed-loop client kept every drain busy to its timeout) and the held requests then lost their
    connection with the torn-down router ('Server disconnected', 'Response payload is not completed'). The two cut
    off count as `cut_off` failures, not as clients that left: their clients got an error, which AIPerf counts."""
    from orchestrator.observe.metrics import RouterMetrics
    from orchestrator.run.serving.warmup import busy_requests

    core = router_core(pd_workers)
    core.metrics = RouterMetrics("test", "1P/1D")
    ingress = Ingress(core)
    long = {"messages": [{"role": "user", "content": "a long story"}], "max_tokens": 100_000, "ignore_eos": True}
    got: dict[str, tuple[int, object]] = {}

    def streamed() -> None:
        with httpx.stream("POST", ingress.url + "/v1/chat/completions", json={**long, "stream": True},
                          timeout=60) as r:
            got["stream"] = (r.status_code, [line[6:] for line in r.iter_lines() if line.startswith("data: ")])

    def answered() -> None:
        r = httpx.post(ingress.url + "/v1/chat/completions", json=long, timeout=60)
        got["json"] = (r.status_code, r.json())

    clients = [threading.Thread(target=streamed), threading.Thread(target=answered)]
    try:
        for c in clients:
            c.start()
        wait_until(lambda: ingress.core.in_flight == 2 and busy_requests(pd_workers) >= 2, 30, 0.05,
                   what="both requests held by the engines")
        ingress.core.stop_admitting("stopping (test)")
        refused = httpx.post(ingress.url + "/v1/chat/completions", json={**long, "max_tokens": 1}, timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down", refused.text
        assert refused.json()["error"]["message"].startswith("stopping (test): the gateway takes no new requests")
        assert httpx.get(ingress.url + "/health", timeout=30).status_code == 503
        assert ingress.core.in_flight == 2 and not got  # those in flight go on

        loop = ingress.server.servers[0].get_loop()
        held = asyncio.run_coroutine_threadsafe(ingress.core.cut_off_in_flight(), loop).result(timeout=30)
        for c in clients:
            c.join(timeout=120)  # a stream's client reads every chunk sent before the cut: slow on a loaded machine
        assert held == 2 and not any(c.is_alive() for c in clients), f"clients still reading after 120 s: {got.keys()}"
        status, body = got["json"]
        assert status == 503 and body["error"]["code"] == "shutting_down", body
        assert "cut off after the drain timeout" in body["error"]["message"], body
        status, events = got["stream"]
        assert status == 200 and events[-1] == "[DONE]", events[-3:]
        assert json.loads(events[-2])["error"]["code"] == "shutting_down", events[-3:]
        assert "choices" in json.loads(events[-3])  # tokens were streamed before the cut
        wait_engines_free(ingress.core, pd_workers, "after the cut-off")

        def counted(name: str, **labels: str) -> float:
            return core.metrics.registry.get_sample_value(name, {"run_id": "test", "layout": "1P/1D", **labels}) or 0.0

        wait_until(lambda: counted("pdorch_requests_failed_total", reason="cut_off") == 2, 10, 0.05,
                   what="both held requests counted as cut off")
        assert counted("pdorch_requests_failed_total", reason="cancelled") == 0
        assert counted("pdorch_requests_rejected_total", reason="stopping") == 1
        assert counted("pdorch_sla_attempted_requests_total") == 3  # AIPerf: three error records
    finally:
        ingress.stop()
