"""A request that fails after its stream began ends with an error its client recognises, and the gateway books it failed.

The gateway's stream ends with `event: error` + OpenAI's error object + `[DONE]`: AIPerf 0.12.0 makes a stream an
error record only on an `event: error` (a lone `data: {"error": ...}` is content to it, so a truncated stream counted
as a valid request), and the openai client raises APIError on the data's `error` key. Real parts: simulated SGLang
engines (their fault knobs and SGLang's own abort), the gateway's ingress app on loopback, the openai client, and
AIPerf 0.12.0's CLI from .venv-aiperf."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from orchestrator.config.benchmark import SloConfig
from orchestrator.observe.metrics import RouterMetrics
from orchestrator.router.core import RouterCore
from orchestrator.run.aiperf import ClosedLoad, find_aiperf, run_profile
from tests.support import Ingress, qwen3_sim_config, router_core, start_servers, wait_until

pytestmark = pytest.mark.slow


def booked(core: RouterCore, name: str, **labels: str) -> float:
    return core.metrics.registry.get_sample_value(name, {"run_id": "test", "layout": "1P/1D", **labels}) or 0.0


def sse_events(raw: str) -> list[tuple[str | None, str]]:
    """(event name or None, data) of every event of a whole SSE body."""
    out = []
    for block in raw.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.strip().splitlines() if ": " in line)
        if "data" in fields:
            out.append((fields.get("event"), fields["data"]))
    return out


LONG = 100_000  # tokens: the request is still streaming when the test aborts it
STREAMS = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "a long story"}], "max_tokens": LONG,
                             "ignore_eos": True, "stream": True},
    "/v1/completions": {"prompt": [1, 2, 3], "max_tokens": LONG, "ignore_eos": True, "stream": True},
    "/generate": {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True},
                  "stream": True},
}


@pytest.mark.parametrize("path", STREAMS)
def test_a_stream_the_engine_aborts_after_its_first_tokens_ends_with_an_error_event(pd_workers, path):
    """SGLang's decode aborts a running request (as it does when its KV transfer fails): every stream path ends with
    `event: error` whose data is OpenAI's error object with the code `decode_aborted`, then [DONE]; the gateway books
    a failure with reason `aborted`, in the good fraction's denominator."""
    core = router_core(pd_workers)
    core.metrics = RouterMetrics("test", "1P/1D")
    ingress = Ingress(core)
    decode_url = next(e.url for e in pd_workers if e.role == "decode")
    try:
        with httpx.stream("POST", ingress.url + path, json=STREAMS[path], timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # tokens are flowing
            httpx.post(decode_url + "/abort_request", json={"abort_all": True}, timeout=10).raise_for_status()
            raw = "\n".join(lines)
        events = sse_events(raw)
        assert events[-1] == (None, "[DONE]"), events[-3:]
        name, data = events[-2]
        error = json.loads(data)["error"]
        assert name == "error" and error["code"] == "decode_aborted" and error["type"] == "server_error", events[-2]
        assert all(n is None for n, _ in events[:-2])  # one error event, at the end
        wait_until(lambda: booked(core, "pdorch_requests_failed_total", reason="aborted") == 1, 10, 0.05,
                   what="the aborted stream booked as failed")
        assert booked(core, "pdorch_sla_attempted_requests_total") == 1
        assert booked(core, "pdorch_sla_judged_requests_total") == 0
    finally:
        ingress.stop()


def test_the_openai_client_raises_a_stream_that_fails_midway(pd_workers):
    ingress = Ingress(router_core(pd_workers))
    decode_url = next(e.url for e in pd_workers if e.role == "decode")
    client = openai.OpenAI(base_url=ingress.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    try:
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=LONG, stream=True, extra_body={"ignore_eos": True})
        next(stream)
        httpx.post(decode_url + "/abort_request", json={"abort_all": True}, timeout=10).raise_for_status()
        with pytest.raises(openai.APIError, match="aborted: decode"):
            for _ in stream:
                pass
    finally:
        ingress.stop()


def test_a_decode_that_dies_mid_stream_ends_the_stream_with_an_error_event(tmp_path):
    """The decode's process exits while it streams (the sim's crash_at_s: no goodbye, like a kill): the client still
    gets an end, `event: error` with `decode_stream_cut`, and the failure is booked by that reason."""
    cfg = qwen3_sim_config("pd")
    prefill, decode = start_servers(cfg, ["prefill", "decode"], tmp_path)
    core = RouterCore(cfg, run_id="test", metrics=RouterMetrics("test", "1P/1D"))
    core.follow(1, [prefill.endpoint(), decode.endpoint()])
    ingress = Ingress(core)
    try:
        body = {**STREAMS["/v1/chat/completions"], "max_tokens": 4000}  # within qwen3's 8192 context
        with httpx.stream("POST", ingress.url + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200, r.read()
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            httpx.post(decode.url + "/sim/faults", json={"crash_at_s": 0}, timeout=10).raise_for_status()
            events = sse_events("\n".join(lines))
        name, data = events[-2]
        assert name == "error" and json.loads(data)["error"]["code"] == "decode_stream_cut", events[-2:]
        assert events[-1] == (None, "[DONE]")
        wait_until(lambda: booked(core, "pdorch_requests_failed_total", reason="stream_cut") == 1, 10, 0.05,
                   what="the broken stream booked as failed")
    finally:
        ingress.stop()
        for s in (prefill, decode):
            s.stop()


def test_aiperf_counts_a_stream_that_fails_midway_as_an_error_as_the_gateway_does(tmp_path):
    """AIPerf 0.12.0 with the contest's command shape (chat, streaming, fixed ISL/OSL, closed loop, goodput), short,
    against the gateway over a simulated qwen3 PD pair whose decode's scheduler raises partway through the run
    (`scheduler_error_after_steps`): the requests streaming at that step end with the gateway's `event: error`, and
    every later one is refused (the decode answers 503). AIPerf's export records the streams cut midway as errors
    (code decode_aborted), and its valid, good and errored counts are the gateway's pdorch_sla_* counters of the
    same run. Before, the cut streams ended with a plain `data: {"error": ...}`, which AIPerf kept as valid requests
    (judged on the tokens they got) while the gateway booked them as clients that left."""
    slo = SloConfig(ttft_ms=10_000, itl_ms=1_000)  # far from the sim's latencies on a loaded 2-core machine
    cfg = qwen3_sim_config("pd")
    prefill, decode = start_servers(cfg, ["prefill", "decode"], tmp_path)
    core = RouterCore(cfg, run_id="test", metrics=RouterMetrics("test", "1P/1D", slo=slo))
    core.follow(1, [prefill.endpoint(), decode.endpoint()])
    ingress = Ingress(core)
    try:
        httpx.post(decode.url + "/sim/faults", json={"scheduler_error_after_steps": 60}, timeout=10).raise_for_status()
        load = ClosedLoad(url=ingress.url, model="sim-model", concurrency=2, input_tokens=64, output_tokens=16,
                          warmup_s=0, window_s=3, grace_s=10, num_dataset_entries=16, ttft_ms=slo.ttft_ms,
                          itl_ms=slo.itl_ms)
        summary = run_profile(find_aiperf(), load, tmp_path / "aiperf", timeout_s=300)
        wait_until(lambda: core.in_flight == 0, 30, 0.05, what="every request answered and booked")
    finally:
        ingress.stop()
        for s in (prefill, decode):
            s.stop()
    records = [json.loads(line) for line in (tmp_path / "aiperf" / "profile_export.jsonl").read_text().splitlines()]
    cut = [r for r in records if "decode_aborted" in json.dumps(r.get("error"))]
    assert cut, f"no AIPerf error record of a stream cut midway among {len(records)}: {_errors(records)}"
    assert summary.request_count > 0 and summary.error_count > len(cut)  # the refused ones after the fault too
    good = round(summary.raw["good_request_count"]["avg"])
    assert (summary.request_count, good, summary.request_count + summary.error_count) == (
        booked(core, "pdorch_sla_judged_requests_total"), booked(core, "pdorch_sla_good_requests_total"),
        booked(core, "pdorch_sla_attempted_requests_total"))
    assert booked(core, "pdorch_requests_failed_total", reason="aborted") == len(cut)


def _errors(records: list[dict]) -> list:
    return sorted({json.dumps(r.get("error"))[:200] for r in records if r.get("error")})[:5]


def test_the_error_event_is_what_aiperfs_parser_reads_as_an_error():
    """AIPerf 0.12.0's own SSE check (run in its environment): the gateway's error event raises its SSEResponseError;
    the `data:`-only form the gateway sent before passes as content."""
    import subprocess

    from orchestrator.router.json_response import error_object, sse_error_event

    check = ("import sys; from aiperf.common.models import SSEMessage; "
             "from aiperf.transports.sse_utils import AsyncSSEStreamReader as R\n"
             "for raw in sys.argv[1:]:\n"
             "    try:\n"
             "        R.inspect_message_for_error(SSEMessage.parse(raw.strip(), 0)); print('content')\n"
             "    except Exception as e: print(type(e).__name__)")
    error = error_object(502, "stream_cut: decode d0: gone", code="decode_stream_cut")
    new = sse_error_event(error).decode()
    old = "data: " + json.dumps(error)
    python = Path(find_aiperf().exe).parent / "python"
    out = subprocess.run([str(python), "-c", check, new, old], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["SSEResponseError", "content"], out.stdout + out.stderr
