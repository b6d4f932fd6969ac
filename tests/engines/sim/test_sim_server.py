"""The simulated engine as a PD router sees it: real server processes on loopback, driven like mini_lb.

Each server is launched the way the orchestrator launches it (tests/support.py SimServer: the backend's
build_launch -> EngineProcess).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.cluster.ports import free_port
from orchestrator.config.model_presets import DEEPSEEK_R1
from tests.support import HAVE_NIXL, SimServer, pd_generate, sim_engine_config, sim_server, start_servers, wait_until

pytestmark = pytest.mark.slow  # simulated engine servers as subprocesses

os.environ.setdefault("UCX_NET_DEVICES", "lo")


@pytest.fixture(scope="module", params=["nixl", "http"])
def pd_pair(request, tmp_path_factory) -> Iterator[tuple[SimServer, SimServer]]:
    if request.param == "nixl" and not HAVE_NIXL:
        pytest.skip("nixl is not importable")
    extra = ("--kv-verify", "sampled") if request.param == "http" else ()  # both verification modes covered
    servers = start_servers(sim_engine_config(kv_transfer=request.param, extra_args=extra), ["prefill", "decode"],
                            tmp_path_factory.mktemp(f"pd-{request.param}"))
    yield servers[0], servers[1]
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def aggregated(tmp_path_factory) -> Iterator[SimServer]:
    (server,) = start_servers(sim_engine_config(mode="aggregated"), ["aggregated"], tmp_path_factory.mktemp("agg"))
    yield server
    server.stop()


def scrape(server: SimServer) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{server.url}/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def total(samples: dict, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


PROMPTS = [list(range(3, 3 + n)) for n in (5, 40, 300)] + [[(7 * i) % 129000 for i in range(1200)]]
OUTPUT_LENS = [4, 1, 17, 9]


async def test_pd_pair_answers_like_sglang_with_requested_lengths(pd_pair, aggregated):
    prefill, decode = pd_pair
    results = await asyncio.gather(*(
        pd_generate(prefill, decode, {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}})
        for ids, n in zip(PROMPTS, OUTPUT_LENS)
    ))
    async with httpx.AsyncClient(timeout=60) as client:
        agg = await asyncio.gather(*(
            client.post(f"{aggregated.url}/generate",
                        json={"input_ids": ids, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}})
            for ids, n in zip(PROMPTS, OUTPUT_LENS)
        ))
    for (p, d), a, ids, n in zip(results, agg, PROMPTS, OUTPUT_LENS):
        assert p.status_code == 200 and d.status_code == 200, (p.text, d.text)
        pm, dm = p.json()["meta_info"], d.json()["meta_info"]
        assert pm["finish_reason"] == {"type": "length", "length": 0}  # the prefill leg only signals completion
        assert pm["id"] == dm["id"]
        assert dm["finish_reason"] == {"type": "length", "length": n}
        assert dm["completion_tokens"] == n == len(d.json()["output_ids"])
        assert dm["prompt_tokens"] == len(ids) and dm["simulated"] is True
        # the first token comes from the prefill, with the KV; PD and aggregated agree token for token
        assert d.json()["output_ids"][0] == p.json()["output_ids"][0]
        assert d.json()["output_ids"] == a.json()["output_ids"]


async def test_kv_transfer_moves_the_models_bytes_and_metrics_move(pd_pair):
    prefill, decode = pd_pair
    p_before, d_before = scrape(prefill), scrape(decode)
    prompt = PROMPTS[-1]  # 1200 tokens of R1 KV = 84 MB: more than the decode's 64 MiB receive buffer
    p, d = await pd_generate(prefill, decode, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 3}})
    assert p.status_code == 200 and d.status_code == 200
    p_after, d_after = scrape(prefill), scrape(decode)
    moved_mb = total(p_after, "sglang:kv_transfer_total_mb_sum") - total(p_before, "sglang:kv_transfer_total_mb_sum")
    assert moved_mb == pytest.approx(len(prompt) * DEEPSEEK_R1.kv_bytes_per_token(2) / 1e6)
    assert total(p_after, "sglang:kv_transfer_latency_ms_count") > total(p_before, "sglang:kv_transfer_latency_ms_count")
    gen = "sglang:generation_tokens_total"
    assert total(d_after, gen) - total(d_before, gen) == len(d.json()["output_ids"])
    assert total(d_after, "sglang:num_requests_total") == total(d_before, "sglang:num_requests_total") + 1
    labels = {dict(k[1]).get("engine_type") for k in d_after if k[0] == "sglang:num_running_reqs"}
    assert labels == {"decode"}
    assert total(d_after, "sglang:simulated") == 1
    info = httpx.get(f"{prefill.url}/server_info").json()
    assert info["sim"]["kv_transfer"] in ("nixl", "http") and info["simulated"] is True


async def test_request_without_bootstrap_room_is_rejected_with_sglangs_400(pd_pair):
    for server in pd_pair:
        r = httpx.post(f"{server.url}/generate", json={"input_ids": [1, 2, 3], "bootstrap_host": "127.0.0.1"})
        assert r.status_code == 400
        assert r.json() == {
            "error": {"message": "Invalid request: Disaggregated request received without bootstrap room id."}
        }


async def test_out_of_vocabulary_ids_are_refused_by_both_legs_with_sglangs_400(pd_pair):
    prefill, decode = pd_pair
    for bad in (DEEPSEEK_R1.vocab_size, -1):
        p, d = await pd_generate(prefill, decode, {"input_ids": [5, bad, 7], "sampling_params": {"max_new_tokens": 2}})
        expected = {"error": {"message": f"input_ids contains out-of-vocabulary token id {bad}; valid range is "
                                         f"[0, {DEEPSEEK_R1.vocab_size})."}}
        assert (p.status_code, p.json()) == (d.status_code, d.json()) == (400, expected)


def test_a_pair_whose_kv_cache_dtypes_differ_is_refused_as_sglangs_decode_does(tmp_path):
    fp8 = sim_engine_config().model_copy(deep=True)
    fp8.engine.sglang.kv_cache_dtype = "fp8_e4m3"
    prefill = SimServer(fp8, "prefill", tmp_path)
    decode = SimServer(sim_engine_config(), "decode", tmp_path)
    try:
        prefill.wait(), decode.wait()
        route = httpx.get(f"http://127.0.0.1:{prefill.bootstrap_port}/route", params={
            "prefill_dp_rank": -1, "prefill_cp_rank": -1, "target_tp_rank": -1, "target_pp_rank": -1}).json()
        assert (route["kv_cache_dtype"], route["page_size"]) == ("fp8_e4m3", 1)  # the server's own, not "auto"
        body = {"input_ids": [4, 5, 6], "sampling_params": {"max_new_tokens": 2}, "bootstrap_host": "127.0.0.1",
                "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": 11}
        r = httpx.post(f"{decode.url}/generate", json=body, timeout=30)
        assert r.status_code == 500
        assert ("KV cache dtype mismatch: prefill server has kv_cache_dtype=fp8_e4m3, but decode server has "
                "kv_cache_dtype=auto") in r.json()["message"]
    finally:
        prefill.stop(), decode.stop()


def test_a_decode_refuses_a_prompt_its_kv_pool_can_never_pre_allocate_with_the_numbers(tmp_path):
    cfg = sim_engine_config()
    cfg.engine.sglang.max_total_tokens = 2000
    decode = SimServer(cfg, "decode", tmp_path)
    try:
        decode.wait()
        body = {"input_ids": list(range(3, 1603)), "sampling_params": {"max_new_tokens": 2}, "bootstrap_host": "127.0.0.1",
                "bootstrap_port": free_port(), "bootstrap_room": 12}
        r = httpx.post(f"{decode.url}/generate", json=body, timeout=30)
    finally:
        decode.stop()
    assert r.status_code == 400  # at once: no prefill needed, none contacted
    assert r.json()["error"]["message"].startswith(
        "The input (1600 tokens) + 512 reserved decode tokens (--num-reserved-decode-tokens) = 2112 tokens exceeds the "
        "decode's KV pool (2000 tokens)")


async def test_decode_streams_sse_chunks_ending_in_done(pd_pair):
    prefill, decode = pd_pair
    body = {"input_ids": PROMPTS[1], "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}, "stream": True}
    p, d = await pd_generate(prefill, decode, body)
    assert p.status_code == 200 and d.status_code == 200
    events = [line[len("data: "):] for line in d.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 2
    lengths = [len(c["output_ids"]) for c in chunks]
    assert lengths == sorted(set(lengths))  # cumulative, and every chunk brings new tokens
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert len(chunks[-1]["output_ids"]) == 6


def test_aggregated_server_serves_text_batches_and_sglang_info_routes(aggregated):
    r = httpx.post(f"{aggregated.url}/generate", json={
        "text": ["Hello world", "The capital city of France is"],
        "sampling_params": {"max_new_tokens": 5, "ignore_eos": True},
    }, timeout=30)
    assert r.status_code == 200
    outs = r.json()
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [5, 5]
    assert all(isinstance(o["text"], str) and o["meta_info"]["prompt_tokens"] >= 2 for o in outs)
    info = httpx.get(f"{aggregated.url}/get_server_info").json()
    assert info["disaggregation_mode"] == "null"
    assert info["internal_states"][0]["last_gen_throughput"] >= 0
    assert info["max_total_num_tokens"] > 0 and "load_weight" in info["startup_time"]
    assert httpx.get(f"{aggregated.url}/model_info").json()["is_generation"] is True
    assert httpx.get(f"{aggregated.url}/v1/models").json()["data"][0]["id"] == "DeepSeek-R1"
    assert httpx.get(f"{aggregated.url}/health_generate", timeout=30).status_code == 200
    assert httpx.post(f"{aggregated.url}/flush_cache").status_code == 200


async def test_abort_request_by_rid_prefix_ends_the_request_with_abort(aggregated):
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 100_000, "ignore_eos": True},
            "rid": "abort-me-123"}  # within R1's 163,840-token context (more is refused), minutes of decode
    async with httpx.AsyncClient(timeout=60) as client:
        pending = asyncio.ensure_future(client.post(f"{aggregated.url}/generate", json=body))
        await _until(lambda: total(scrape(aggregated), "sglang:num_running_reqs") >= 1)
        assert (await client.post(f"{aggregated.url}/abort_request", json={"rid": "abort-me"})).status_code == 200
        r = await pending
    assert r.status_code == 200
    assert r.json()["meta_info"]["finish_reason"]["type"] == "abort"


async def _until(condition, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


# ----- failures and faults -------------------------------------------------------------------------------
SHORT_TIMEOUTS = ("--heartbeat-interval-s", "0.3", "--heartbeat-max-failures", "2", "--waiting-timeout-s", "3",
                  "--bootstrap-retries", "3", "--bootstrap-retry-interval-s", "0.2")


@pytest.fixture
def fragile_pair(tmp_path) -> Iterator[tuple[SimServer, SimServer]]:
    servers = start_servers(sim_engine_config(extra_args=SHORT_TIMEOUTS), ["prefill", "decode"], tmp_path)
    yield servers[0], servers[1]
    for s in servers:
        s.stop()


async def test_killed_prefill_fails_the_decode_within_the_heartbeat_window(fragile_pair):
    prefill, decode = fragile_pair
    body = {"input_ids": [4, 5, 6], "sampling_params": {"max_new_tokens": 4},
            "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": 77, "rid": "k1"}
    async with httpx.AsyncClient(timeout=30) as client:
        # only the decode gets the request: it handshakes and waits for KV that the prefill will never send
        pending = asyncio.ensure_future(client.post(f"{decode.url}/generate", json=body))
        await _until(lambda: total(scrape(decode), "sglang:num_decode_transfer_queue_reqs") >= 1)
        os.killpg(prefill.proc.proc.pid, signal.SIGKILL)
        r = await pending  # the client timeout (30 s) bounds the test; the heartbeat ends it in ~1 s
    assert r.status_code == 500
    assert "Lost connection with prefill instance" in r.json()["message"]
    assert total(scrape(decode), "sglang:num_transfer_failed_reqs_total") == 1


async def test_unreachable_prefill_fails_the_decode_handshake(fragile_pair):
    _, decode = fragile_pair
    body = {"input_ids": [4, 5, 6], "bootstrap_host": "127.0.0.1", "bootstrap_port": free_port(), "bootstrap_room": 5}
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(f"{decode.url}/generate", json=body)
    assert r.status_code == 500 and "Decode handshake failed" in r.json()["message"]
    assert total(scrape(decode), "sglang:num_bootstrap_failed_reqs_total") == 1


async def test_hung_transfer_times_out_on_decode_and_aborts_the_prefill_leg(fragile_pair):
    prefill, decode = fragile_pair
    assert httpx.post(f"{prefill.url}/sim/faults", json={"hang": "transfer"}).status_code == 200
    p, d = await pd_generate(prefill, decode, {"input_ids": [9, 9, 9], "sampling_params": {"max_new_tokens": 2}})
    assert d.status_code == 500 and "timed out" in d.json()["message"]  # --waiting-timeout-s 3
    assert p.status_code == 500 and "Prefill transfer failed" in p.json()["message"]


def test_error_rate_corrupt_and_hang_faults(aggregated):
    url = aggregated.url
    body = {"input_ids": [11, 12, 13], "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}
    clean = httpx.post(f"{url}/generate", json=body).json()["output_ids"]
    try:
        httpx.post(f"{url}/sim/faults", json={"error_rate": 1.0}).raise_for_status()
        r = httpx.post(f"{url}/generate", json=body)
        assert r.status_code == 500 and r.json()["object"] == "error" and r.json()["code"] == 500

        httpx.post(f"{url}/sim/faults", json={"corrupt_rate": 1.0}).raise_for_status()
        r = httpx.post(f"{url}/generate", json=body)
        assert r.status_code == 200
        assert len(r.json()["output_ids"]) == 5 and r.json()["output_ids"] != clean

        httpx.post(f"{url}/sim/faults", json={"hang": "requests"}).raise_for_status()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/generate", json=body, timeout=1.0)
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(f"{url}/health", timeout=1.0)

        bad = httpx.post(f"{url}/sim/faults", json={"explode": True})
        assert bad.status_code == 400 and "explode" in bad.json()["error"]["message"]
    finally:
        httpx.post(f"{url}/sim/faults", json={}).raise_for_status()
    assert httpx.post(f"{url}/generate", json=body).json()["output_ids"] == clean


@pytest.mark.parametrize("how", ["crash_after_requests in the run config", "crash_at_s posted at run time"])
def test_crash_fault_kills_the_process_like_a_kill(tmp_path, how):
    cfg = sim_engine_config(mode="aggregated")
    if how.startswith("crash_after_requests"):
        cfg.engine.sim.faults = {"aggregated": {"crash_after_requests": 1}}
    (server,) = start_servers(cfg, ["aggregated"], tmp_path)
    try:
        ok = httpx.post(f"{server.url}/generate", json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})
        assert ok.status_code == 200
        if how.startswith("crash_after_requests"):
            with pytest.raises(httpx.TransportError):
                httpx.post(f"{server.url}/generate", json={"input_ids": [1, 2]}, timeout=10)
        else:
            httpx.post(f"{server.url}/sim/faults", json={"crash_at_s": 0.2}).raise_for_status()
        assert server.proc.proc.wait(timeout=10) == 137
    finally:
        server.stop()


async def test_a_scheduler_step_that_raises_fails_the_requests_in_flight_and_new_ones_and_turns_the_server_unhealthy():
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 100_000, "ignore_eos": True}}  # within the context
    cause = "simulated scheduler failed: SimulatedEngineBug: injected fault scheduler_error_after_steps=0"
    with sim_server() as url:
        running = lambda: total(scrape(SimpleNamespace(url=url)), "sglang:num_running_reqs")  # noqa: E731
        async with httpx.AsyncClient(timeout=30) as client:
            chunks = []
            async with client.stream("POST", f"{url}/generate", json={**body, "stream": True}) as streamed:
                plain = asyncio.ensure_future(client.post(f"{url}/generate", json=body))
                await _until(lambda: running() >= 2)  # both requests are in the running batch
                (await client.post(f"{url}/sim/faults", json={"scheduler_error_after_steps": 0})).raise_for_status()
                async for line in streamed.aiter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line[6:]))
            answered = await plain
            health, later = await asyncio.gather(client.get(f"{url}/health"), client.post(f"{url}/generate", json=body))
    assert len(chunks[-1]["output_ids"]) > 0  # it was streaming tokens when the step raised
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert chunks[-1]["meta_info"]["finish_reason"]["message"].startswith(cause)
    assert answered.status_code == 500 and answered.json()["message"].startswith(cause)
    assert health.status_code == 503 and health.text.startswith(cause)
    assert later.status_code == 503 and later.json()["message"].startswith(cause)


def test_model_that_does_not_fit_is_refused_before_binding(capsys):
    from orchestrator.cli import main

    rc = main(["sim-server", "--profile", "H100-SXM", "--quantization", "fp8", "--tp-size", "8", "--port", str(free_port())])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no room for KV cache" in err and "--tp-size" in err


@pytest.mark.parametrize(
    "body, needle",
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "body: send a JSON object"),
        ({}, "text, input_ids: send exactly one of them"),
        ({"input_ids": ["a"]}, "input_ids.0"),
        ({"input_ids": [-1]}, "valid range is [0, 129280)"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": -3}}, "sampling_params.max_new_tokens"),
        ({"input_ids": [[1], [2]], "rid": ["a"]}, "rid: 1 values for a batch of 2 prompts"),
        ({"input_ids": []}, "input_ids: empty prompt"),
    ],
)
def test_bad_generate_bodies_get_400_naming_the_field(aggregated, body, needle):
    kwargs = {"content": body} if isinstance(body, str) else {"json": body}
    r = httpx.post(f"{aggregated.url}/generate", **kwargs)
    assert r.status_code == 400
    assert needle in r.json()["error"]["message"]


LONG_GENERATE = {"input_ids": list(range(3, 40)), "sampling_params": {"max_new_tokens": 30000, "ignore_eos": True}}
LONG_CHAT = {"messages": [{"role": "user", "content": "a long story"}], "max_tokens": 30000, "ignore_eos": True}


@pytest.mark.parametrize("path, body", [
    ("/generate", LONG_GENERATE), ("/generate", {**LONG_GENERATE, "stream": True}),
    ("/v1/chat/completions", LONG_CHAT), ("/v1/chat/completions", {**LONG_CHAT, "stream": True}),
])
def test_a_request_whose_client_goes_away_is_aborted_as_sglang_does(aggregated, path, body):
    """The router cancels a leg by closing its connection (then sends /abort_request, which finds nothing when it
    overtakes the leg's own POST): SGLang aborts a request whose client disconnected, streamed or not
    (tokenizer_manager's request.is_disconnected()), and so must the sim, or it generates on to max_tokens for
    nobody and counts as finished a prompt nobody received. Non-streamed requests were run to their end (CI, stop 42:
    a gateway test's decode leg held for minutes)."""
    import socket

    before = scrape(aggregated)

    def counted() -> dict:
        now = scrape(aggregated)
        return {name: total(now, name) - total(before, name)
                for name in ("sglang:num_requests_total", "sglang:num_aborted_requests_total")}

    payload = json.dumps(body).encode()
    client = socket.create_connection(("127.0.0.1", int(aggregated.url.rsplit(":", 1)[1])), timeout=30)
    client.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    wait_until(lambda: total(scrape(aggregated), "sglang:num_running_reqs") > 0, 30, 0.05, "the request running")
    client.close()
    wait_until(lambda: counted()["sglang:num_requests_total"] == 1, 30, 0.05, "the request to end on the server")
    assert counted()["sglang:num_aborted_requests_total"] == 1, "the disconnected request was run to its end"
