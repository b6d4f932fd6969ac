"""The simulated engine's OpenAI routes, spoken to as clients speak to SGLang 0.5.17: the OpenAI SDK, raw SSE,
and a PD pair driven like sglang-router's mini_lb (the same body, with bootstrap fields, to both legs)."""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Iterator

import httpx
import openai
import pytest

from orchestrator.workload.tokenizer import load_tokenizer
from tests.support import SimServer, qwen3_sim_config, sim_engine_config, start_servers

pytestmark = pytest.mark.slow  # simulated engine servers as subprocesses

os.environ.setdefault("UCX_NET_DEVICES", "lo")


@pytest.fixture(scope="module")
def aggregated(tmp_path_factory) -> Iterator[SimServer]:
    (server,) = start_servers(sim_engine_config(mode="aggregated"), ["aggregated"], tmp_path_factory.mktemp("agg"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pd_pair(tmp_path_factory) -> Iterator[tuple[SimServer, SimServer]]:
    servers = start_servers(sim_engine_config(kv_transfer="http"), ["prefill", "decode"], tmp_path_factory.mktemp("pd"))
    yield servers[0], servers[1]
    for s in servers:
        s.stop()


def sse_events(text: str) -> list:
    """Every `data:` payload of an SSE body, parsed; the closing [DONE] kept as the string."""
    events = [block.removeprefix("data: ") for block in text.split("\n\n") if block.strip()]
    assert all(not block.startswith("data:") for block in events)
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def test_openai_sdk_chat_and_completions_get_the_budget_they_asked_for(aggregated):
    client = openai.OpenAI(base_url=f"{aggregated.url}/v1", api_key="none", timeout=60)
    chat = client.chat.completions.create(model="qwen-test", messages=[{"role": "user", "content": "Hi there"}],
                                          max_completion_tokens=7, extra_body={"ignore_eos": True, "min_tokens": 7})
    assert chat.object == "chat.completion" and chat.model == "qwen-test"  # SGLang echoes the request's model
    assert chat.choices[0].finish_reason == "length" and chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == 7 and chat.usage.total_tokens == chat.usage.prompt_tokens + 7
    assert chat.usage.prompt_tokens > 2  # the chat template wraps the two words
    assert chat.choices[0].message.content

    chunks = list(client.completions.create(model="m", prompt=[1, 2, 3, 4], max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}))
    texts = [c.choices[0] for c in chunks if c.choices]
    assert [c.finish_reason for c in texts] == [None] * (len(texts) - 1) + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.prompt_tokens == 4

    batch = client.completions.create(model="m", prompt=["one prompt", "and another"], max_tokens=3)
    assert [c.index for c in batch.choices] == [0, 1] and batch.usage.completion_tokens == 6


def test_chat_stream_frames_like_sglang(aggregated):
    body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go"}],
            "max_tokens": 6, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    r = httpx.post(f"{aggregated.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    role, *content, finish, usage, _ = events
    assert role["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert content and all(c["choices"][0]["finish_reason"] is None and c["choices"][0]["delta"]["content"]
                           for c in content)
    # SGLang sends the finish_reason in a chunk of its own, after the last content, then the usage chunk
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert len({e["id"] for e in events[:-1]}) == 1 and all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    whole = httpx.post(f"{aggregated.url}/v1/chat/completions", json={**body, "stream": False}, timeout=60).json()
    assert whole["usage"]["prompt_tokens"] == usage["usage"]["prompt_tokens"]


@pytest.mark.parametrize("path,body,needle", [
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "min_tokens": 5},
     "min_tokens (5)"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, "max_tokens"),
    # SGLang 0.5.17's CompletionRequest: "max_tokens must be positive"
    ("/v1/completions", {"prompt": [1, 2], "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": ""}, "Prompt cannot be empty"),
    ("/v1/completions", {"max_tokens": 3}, "prompt: required"),
    ("/v1/completions", "not json", "not valid JSON"),
    ("/v1/completions", {"prompt": [1, 2], "bootstrap_port": 0}, "bootstrap_port"),
    # SGLang refuses a completion that cannot fit the context at once; it does not generate until a cap
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6},
     "exceeds the model's maximum context length of 163840 tokens"),
])
def test_malformed_openai_bodies_get_sglangs_400(aggregated, path, body, needle):
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(aggregated.url + path, content=content, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["object"] == "error" and err["code"] == 400 and needle in err["message"], err


def test_non_json_content_type_is_refused_as_sglang_does(aggregated):
    r = httpx.post(f"{aggregated.url}/v1/chat/completions", content=b'{"messages": []}',
                   headers={"content-type": "text/plain"}, timeout=30)
    assert r.status_code == 400 and "application/json" in r.json()["message"]


async def test_pd_pair_serves_chat_with_bootstrap_fields_like_mini_lb(pd_pair):
    prefill, decode = pd_pair
    body = {"model": "m", "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 9,
            "ignore_eos": True, "stream": True, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": random.randint(1, 2**63 - 1)}
    async with httpx.AsyncClient(timeout=60) as client:
        p, d = await asyncio.gather(client.post(f"{prefill.url}/v1/chat/completions", json=body),
                                    client.post(f"{decode.url}/v1/chat/completions", json=body))
        assert p.status_code == 200 and d.status_code == 200, (p.text, d.text)
        events = sse_events(d.text)
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[1:-1])
        assert text
        missing_room = await client.post(f"{decode.url}/v1/chat/completions",
                                         json={k: v for k, v in body.items() if k != "bootstrap_room"})
    assert missing_room.status_code == 400 and "bootstrap room" in missing_room.json()["message"]


def test_qwen3_worker_applies_chatml_and_counts_prompts_with_qwens_tokenizer(tmp_path):
    (server,) = start_servers(qwen3_sim_config(), ["aggregated"], tmp_path)
    try:
        info = httpx.get(f"{server.url}/model_info").json()
        assert info["architectures"] == ["Qwen3MoeForCausalLM"]
        text = "Write one line about the sea."
        r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": text}], "max_tokens": 4, "ignore_eos": True})
        tok = load_tokenizer(None, "qwen3-235b-a22b-fp8")
        templated = tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
        assert r.json()["usage"]["prompt_tokens"] == len(templated) == len(tok.encode(text)) + 8
    finally:
        server.stop()
