"""The PD dispatcher, without Ray: pairing fields, concurrency limit, aborts, retries, timeouts, streams.

The servers are real HTTP servers on loopback that speak the part of SGLang's PD protocol the router
sees (`/generate` with bootstrap fields, `/abort_request`, `/health`): a decode only answers once "its"
prefill (same bootstrap port and room) has taken the request, as in SGLang. Each can be told to fail
(`fail_status`) or to hang, which a real engine cannot be made to do on cue.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Callable

import pytest
from aiohttp import web

from orchestrator.records import CUT_OFF_IN_FLIGHT, NEVER_SENT, BenchRequest, WorkerEndpoint
from orchestrator.router.batch import run_batch
from orchestrator.router.dispatch.dispatcher import PDDispatcher
from orchestrator.router.dispatch.failures import DispatchError
from orchestrator.router.dispatch.settings import DispatchSettings

KV_BOARD: dict[tuple[int, int], asyncio.Event] = {}  # (prefill bootstrap port, room) -> KV "landed"


class PDServer:
    """One loopback engine server of a role; records every body and abort it receives."""

    def __init__(self, role: str, name: str, bootstrap_port: int | None = None):
        self.role = role
        self.name = name
        self.bootstrap_port = bootstrap_port
        self.bodies: list[dict] = []
        self.aborted: list[str] = []
        self.fail_status: int | None = None
        self.hang = False
        self.hang_after_kv = False  # prefill: hand over the KV, then never answer (0.5.17 NIXL can)
        self.send_delay_s = 0.0  # decode: a finished answer reaches the router this late (a lagging reader)
        self.finished = 0  # decode: requests generated to their end (the engine's own tally)
        self.in_flight = 0
        self.max_in_flight = 0
        self.on_request: Callable[[], None] | None = None  # called as each /generate body is read
        self._abort_events: dict[str, asyncio.Event] = {}
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> "PDServer":
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/abort_request", self.abort)
        app.router.add_get("/health", self.health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def endpoint(self) -> WorkerEndpoint:
        return WorkerEndpoint(role=self.role, name=self.name, url=self.url,  # type: ignore[arg-type]
                              bootstrap_host="127.0.0.1" if self.role == "prefill" else None,
                              bootstrap_port=self.bootstrap_port)

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def abort(self, request: web.Request) -> web.Response:
        rid = (await request.json())["rid"]
        self.aborted.append(rid)
        for key, ev in self._abort_events.items():
            if key.startswith(rid):  # SGLang matches by rid prefix
                ev.set()
        return web.json_response({})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.on_request is not None:
            self.on_request()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request, body)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request, body: dict) -> web.StreamResponse:
        aborted = self._abort_events.setdefault(body["rid"], asyncio.Event())
        if self.hang:
            await aborted.wait()
            return web.json_response({"error": {"message": "aborted"}}, status=500)
        if self.fail_status is not None:
            return web.json_response({"error": {"message": f"{self.name} told to fail"}}, status=self.fail_status)
        n = body["sampling_params"]["max_new_tokens"]
        if self.role == "prefill":
            KV_BOARD.setdefault((self.bootstrap_port, body["bootstrap_room"]), asyncio.Event()).set()
            if self.hang_after_kv:
                await aborted.wait()
            return web.json_response({"text": "", "output_ids": [7], "meta_info": {"completion_tokens": 1}})
        if self.role == "decode":  # wait for the KV of the prefill the router named, or an abort
            kv = KV_BOARD.setdefault((body["bootstrap_port"], body["bootstrap_room"]), asyncio.Event())
            waiters = [asyncio.ensure_future(kv.wait()), asyncio.ensure_future(aborted.wait())]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
            if aborted.is_set():
                return web.json_response({"error": {"message": "Aborted by AbortReq."}}, status=500)
        if self.role == "decode":
            self.finished += 1  # from here an abort changes nothing: the answer is on its way
            if self.send_delay_s:
                await asyncio.sleep(self.send_delay_s)
        ids = list(range(100, 100 + n))
        meta = lambda k: {"id": body["rid"], "prompt_tokens": len(body["input_ids"]), "completion_tokens": k,  # noqa: E731
                          "finish_reason": {"type": "length", "length": n} if k == n else None}
        if not body.get("stream"):
            return web.json_response({"text": "x" * n, "output_ids": ids, "meta_info": meta(n)})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for k in range(1, n + 1):  # incremental output_ids per chunk, like SGLang's stream
            chunk = {"text": "x" * k, "output_ids": ids[k - 1:k], "meta_info": meta(k)}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture
async def servers():
    """Two prefills and two decodes, started and stopped with the test."""
    made = [
        await PDServer("prefill", "prefill-0/0", bootstrap_port=18_000).start(),
        await PDServer("prefill", "prefill-0/1", bootstrap_port=18_001).start(),
        await PDServer("decode", "decode-0/0").start(),
        await PDServer("decode", "decode-0/1").start(),
    ]
    yield {s.name: s for s in made}
    for s in made:
        await s.stop()


async def make_dispatcher(servers: dict[str, PDServer], names: list[str] | None = None, **settings) -> PDDispatcher:
    d = PDDispatcher(DispatchSettings(**{"backoff_s": 0.0, **settings}))
    d.set_workers(servers[n].endpoint() for n in (names or list(servers)))
    return d


def bench(n: int, output_len: int = 4) -> list[BenchRequest]:
    return [BenchRequest(index=i, input_ids=[1, 2, 3, i], output_len=output_len) for i in range(n)]


async def collect(d: PDDispatcher, reqs: list[BenchRequest], max_in_flight: int = 8,
                  deadline_at: float | None = None) -> list:
    try:
        return [r async for r in run_batch(d, reqs, max_in_flight, deadline_at)]
    finally:
        await d.close()


async def test_both_legs_get_the_same_rid_room_and_the_prefills_bootstrap_address(servers):
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"])
    [result] = await collect(d, bench(1, output_len=5))
    [p_body] = servers["prefill-0/0"].bodies
    [d_body] = servers["decode-0/0"].bodies
    assert p_body == d_body  # the identical body goes to both legs
    assert p_body["bootstrap_host"] == "127.0.0.1" and p_body["bootstrap_port"] == 18_000
    assert 0 < p_body["bootstrap_room"] < 2**63
    assert p_body["input_ids"] == [1, 2, 3, 0]
    assert p_body["sampling_params"] == {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}
    assert result.status == "ok", result.error
    assert result.completion_tokens == 5 and result.output_ids == [100, 101, 102, 103, 104]
    assert (result.prefill_worker, result.decode_worker) == ("prefill-0/0", "decode-0/0")
    assert result.ttft_s is not None and result.kv_wait_s is not None and result.e2e_s is not None
    assert result.ttft_s <= result.e2e_s


async def test_concurrent_requests_get_distinct_rooms_and_prefix_free_rids(servers):
    d = await make_dispatcher(servers)
    results = await collect(d, bench(40), max_in_flight=16)
    bodies = servers["decode-0/0"].bodies + servers["decode-0/1"].bodies
    rooms = [b["bootstrap_room"] for b in bodies]
    rids = [b["rid"] for b in bodies]
    assert len(set(rooms)) == 40 and len(set(rids)) == 40
    # /abort_request matches by prefix, so no rid may be a prefix of another: same length, distinct.
    assert len({len(r) for r in rids}) == 1
    assert sorted(r.index for r in results) == list(range(40))
    assert all(r.status == "ok" for r in results)


async def test_admission_never_exceeds_max_in_flight_and_every_request_is_answered_once(servers):
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"])
    results = await collect(d, bench(30, output_len=16), max_in_flight=3)
    assert servers["decode-0/0"].max_in_flight <= 3
    assert sorted(r.index for r in results) == list(range(30))


async def test_least_outstanding_spreads_load_over_both_pairs(servers):
    d = await make_dispatcher(servers, policy="least_outstanding")
    results = await collect(d, bench(20), max_in_flight=4)
    used = {(r.prefill_worker, r.decode_worker) for r in results}
    assert {p for p, _ in used} == {"prefill-0/0", "prefill-0/1"}
    assert {dd for _, dd in used} == {"decode-0/0", "decode-0/1"}


async def test_random_draws_each_leg_apart_and_its_seed_repeats_the_pairs(servers):
    """`random` (sglang-router's PD pairing, the organisers' deployment): the decode is drawn apart from the prefill,
    so all four pairs of 2 x 2 serve (round robin's per-role turns give two), the requests reach the servers drawn,
    and router.seed repeats a run's pairs while another seed changes them."""
    async def pairs(seed: int) -> list[tuple[str, str]]:
        for s in servers.values():
            s.bodies.clear()
        results = await collect(await make_dispatcher(servers, policy="random", seed=seed), bench(40), max_in_flight=1)
        assert all(r.status == "ok" for r in results), [r.error for r in results]
        drawn = [(r.prefill_worker, r.decode_worker) for r in sorted(results, key=lambda r: r.index)]
        for name, server in servers.items():  # where the HTTP went is what was drawn
            assert len(server.bodies) == sum(name in pair for pair in drawn)
        return drawn

    first = await pairs(7)
    assert len(set(first)) == 4
    assert await pairs(7) == first
    assert await pairs(8) != first
    round_robin = await collect(await make_dispatcher(servers, policy="round_robin"), bench(40), max_in_flight=1)
    assert len({(r.prefill_worker, r.decode_worker) for r in round_robin}) == 2


async def test_failed_prefill_aborts_its_decode_leg_and_the_request_is_retried_on_another_pair(servers):
    servers["prefill-0/0"].fail_status = 500
    d = await make_dispatcher(servers, ["prefill-0/0", "prefill-0/1", "decode-0/0"], policy="round_robin")
    [result] = await collect(d, bench(1))
    assert result.status == "ok", result.error
    assert result.attempts == 2 and result.prefill_worker == "prefill-0/1"
    first_rid = servers["prefill-0/0"].bodies[0]["rid"]
    assert first_rid in servers["decode-0/0"].aborted  # the orphaned decode leg was freed
    assert d.workers["prefill-0/0"].is_suspect()
    assert not d.workers["prefill-0/1"].is_suspect()


async def test_hung_decode_times_out_and_both_legs_are_aborted(servers):
    servers["decode-0/0"].hang = True
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"], request_timeout_s=0.5, max_attempts=1)
    [result] = await collect(d, bench(1))
    assert result.status == "failed"
    assert result.error.startswith("timeout: decode decode-0/0")
    rid = servers["decode-0/0"].bodies[0]["rid"]
    assert rid in servers["prefill-0/0"].aborted and rid in servers["decode-0/0"].aborted


async def test_every_answered_request_has_both_legs_stamped_in_order_and_posted_before_the_engine_read_it(servers):
    read_at: list[float] = []  # wall clock as the prefill read each body (same host, same clock as sent_at)
    servers["prefill-0/0"].on_request = lambda: read_at.append(time.time())
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"])
    results = await collect(d, bench(16), max_in_flight=16)
    assert all(r.status == "ok" for r in results)
    for r in results:
        for leg in ("prefill", "decode"):
            posted, first_byte = getattr(r, f"{leg}_posted_at"), getattr(r, f"{leg}_first_byte_at")
            assert r.sent_at <= posted <= first_byte <= r.done_at, (leg, r)
    posted = sorted(r.prefill_posted_at for r in results)
    assert len(read_at) == 16 and all(p <= t for p, t in zip(posted, sorted(read_at)))  # the n-th read after the n-th post


async def test_a_failed_request_keeps_the_stamps_it_reached(servers):
    servers["decode-0/0"].hang = True  # reads the request, never answers a byte
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"], request_timeout_s=0.5, max_attempts=1)
    [hung] = await collect(d, bench(1))
    assert hung.status == "failed" and hung.error.startswith("timeout: decode")
    assert hung.sent_at <= hung.prefill_posted_at <= hung.prefill_first_byte_at <= hung.done_at
    assert hung.sent_at <= hung.decode_posted_at <= hung.done_at and hung.decode_first_byte_at is None
    d = await make_dispatcher(servers)
    [late] = await collect(d, bench(1), deadline_at=time.time() - 1)  # never sent
    assert late.status == "failed"
    assert (late.prefill_posted_at, late.prefill_first_byte_at, late.decode_posted_at, late.decode_first_byte_at) == (
        None, None, None, None)


async def test_leg_timeout_is_capped_by_the_run_deadline(servers):
    servers["decode-0/0"].hang = True
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"], max_attempts=3)
    started = time.monotonic()
    [result] = await collect(d, bench(1), deadline_at=time.time() + 1.0)
    assert result.status == "failed" and result.error.startswith("timeout")
    assert time.monotonic() - started < 60  # bounded by the deadline, not SGLang's 300 s (loose on purpose)


async def test_client_errors_are_not_retried_and_keep_the_servers_message(servers):
    servers["decode-0/0"].fail_status = 400
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"], max_attempts=3)
    [result] = await collect(d, bench(1))
    assert result.status == "failed" and result.attempts == 1
    assert "http_400" in result.error and "decode-0/0 told to fail" in result.error
    assert not d.workers["decode-0/0"].is_suspect()  # the request was bad, not the worker


async def test_unreachable_decode_is_marked_suspect_and_the_other_one_serves(servers):
    await servers["decode-0/0"].stop()
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0", "decode-0/1"], policy="round_robin")
    results = await collect(d, bench(4), max_in_flight=1)
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    assert {r.decode_worker for r in results} == {"decode-0/1"}
    assert d.workers["decode-0/0"].is_suspect()


async def test_requests_not_sent_before_the_deadline_fail_with_a_deadline_error(servers):
    d = await make_dispatcher(servers)
    results = await collect(d, bench(5), deadline_at=time.time() - 1)
    assert len(results) == 5
    assert all(r.status == "failed" and r.error.startswith("deadline") for r in results)
    assert servers["decode-0/0"].bodies == []


async def test_no_registered_decode_fails_with_a_clear_error(servers):
    d = await make_dispatcher(servers, ["prefill-0/0"])
    [result] = await collect(d, bench(1))
    assert result.status == "failed" and "no healthy decode worker (0 registered)" in result.error


async def test_aggregated_mode_sends_to_one_worker_without_bootstrap_fields():
    agg = await PDServer("aggregated", "agg-0/0").start()
    try:
        d = PDDispatcher(DispatchSettings(), mode="aggregated")
        d.set_workers([agg.endpoint()])
        [result] = await collect(d, bench(1, output_len=3))
        assert result.status == "ok" and result.completion_tokens == 3
        [body] = agg.bodies
        assert "rid" in body and not any(k.startswith("bootstrap") for k in body)
        assert result.prefill_worker is None and result.decode_worker == "agg-0/0"
        # its one leg is stamped as the decode's
        assert result.sent_at <= result.decode_posted_at <= result.decode_first_byte_at <= result.done_at
        assert result.prefill_posted_at is None and result.prefill_first_byte_at is None
    finally:
        await agg.stop()


async def test_stream_relay_passes_the_decode_sse_through(servers):
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"])
    body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 3}, "stream": True}
    relay = await d.open_stream(body)
    assert relay.status == 200
    raw = b"".join([c async for c in relay.chunks()]) + relay.ending()  # the engine's [DONE] is the ending's
    events = [e for e in raw.split(b"\n\n") if e]
    assert relay.failure is None and events[-1] == b"data: [DONE]" and len(events) == 4
    assert json.loads(events[-2][5:])["meta_info"]["completion_tokens"] == 3
    assert d.workers["decode-0/0"].outstanding == 0
    await d.close()


async def test_non_stream_generate_returns_the_decode_json(servers):
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"])
    answer = await d.generate({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})
    assert answer.status == 200 and answer.payload["output_ids"] == [100, 101]
    servers["decode-0/0"].fail_status = 400
    with pytest.raises(DispatchError) as err:
        await d.generate({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})
    assert err.value.status == 400 and err.value.body == {"error": {"message": "decode-0/0 told to fail"}}
    await d.close()


# ---- against the simulated SGLang engine (real processes, real PD transfer) -----------------------------


async def _metric(url: str, name: str) -> float:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def _set_faults(url: str, spec: dict) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.post(url + "/sim/faults", data=json.dumps(spec)) as r:
        assert r.status == 200, await r.text()


async def test_sim_engine_pair_serves_a_batch(pd_workers):
    d = PDDispatcher(DispatchSettings())
    d.set_workers(pd_workers)
    reqs = [BenchRequest(index=i, input_ids=list(range(1, 50 + i)), output_len=8) for i in range(12)]
    results = await collect(d, reqs, max_in_flight=6, deadline_at=time.time() + 120)
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    assert all(r.completion_tokens == 8 and len(r.output_ids) == 8 for r in results)
    assert all(r.kv_wait_s is not None and r.ttft_s is not None for r in results)
    assert all(r.sent_at <= r.prefill_posted_at <= r.prefill_first_byte_at <= r.done_at
               and r.sent_at <= r.decode_posted_at <= r.decode_first_byte_at <= r.done_at for r in results)


async def test_sim_prefill_that_never_sends_kv_is_timed_out_and_the_decode_leg_aborted(pd_workers):
    prefill, decode = pd_workers
    aborted_before = await _metric(decode.url, "sglang:num_aborted_requests_total")
    await _set_faults(prefill.url, {"hang": "transfer"})
    try:
        d = PDDispatcher(DispatchSettings(request_timeout_s=1.0, max_attempts=1))
        d.set_workers(pd_workers)
        [result] = await collect(d, [BenchRequest(index=0, input_ids=[1, 2, 3], output_len=4)])
        assert result.status == "failed" and result.error.startswith("timeout")
        # Without our abort the decode would hold this request for its 300 s waiting timeout.
        deadline = time.monotonic() + 20
        while await _metric(decode.url, "sglang:num_aborted_requests_total") <= aborted_before:
            assert time.monotonic() < deadline, "decode leg was not aborted"
            await asyncio.sleep(0.1)
    finally:
        await _set_faults(prefill.url, {})
    d = PDDispatcher(DispatchSettings())
    d.set_workers(pd_workers)
    [result] = await collect(d, [BenchRequest(index=1, input_ids=[1, 2, 3], output_len=4)])
    assert result.status == "ok", result.error


async def test_router_metrics_count_each_request_once_and_in_flight_returns_to_zero(servers):
    from prometheus_client import CollectorRegistry

    from orchestrator.observe.metrics import RouterMetrics

    metrics = RouterMetrics("run-x", "1P1D", CollectorRegistry())
    servers["prefill-0/0"].fail_status = 500  # first attempts on it fail, their retries succeed elsewhere
    d = PDDispatcher(DispatchSettings(backoff_s=0.0, policy="round_robin"), metrics=metrics)
    d.set_workers(s.endpoint() for s in servers.values())
    results = await collect(d, bench(10), max_in_flight=3)
    value = metrics.registry.get_sample_value
    assert value("pdorch_requests_completed_total", {"run_id": "run-x", "layout": "1P1D"}) == 10
    for state in ("queued", "prefill", "transferring", "decoding"):
        assert value("pdorch_requests_in_flight", {"run_id": "run-x", "layout": "1P1D", "state": state}) == 0
    assert sum(r.attempts for r in results) > 10  # retries happened, yet each request counted once
    assert value("pdorch_worker_outstanding_requests",
                 {"run_id": "run-x", "layout": "1P1D", "role": "decode", "worker": "decode-0/0"}) == 0


async def test_a_worker_leaves_rotation_only_after_consecutive_failed_health_probes(servers):
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"], health_timeout_s=2.0)
    await servers["decode-0/0"].stop()
    for probe in range(1, 4):
        health = await d.check_health()
        assert health == {"prefill-0/0": True, "decode-0/0": False}
        assert d.workers["decode-0/0"].healthy == (probe < 3)
    [result] = await collect(d, bench(1))
    assert result.status == "failed" and "no healthy decode worker (1 registered)" in result.error


async def test_a_prefill_that_never_answers_after_its_decode_finished_does_not_fail_the_request(servers):
    servers["prefill-0/0"].hang_after_kv = True
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"], prefill_grace_s=0.2)
    [result] = await collect(d, bench(1))
    assert result.status == "ok" and result.kv_wait_s is None
    assert servers["prefill-0/0"].aborted == [servers["prefill-0/0"].bodies[0]["rid"]]  # freed, not left waiting


async def test_a_stopped_batch_sends_what_finished_then_ends_and_aborts_the_requests_in_flight(servers):
    """What the bench driver's Ctrl-C / SIGTERM does to the router's batch (PDRouter.stop_batch)."""
    from orchestrator.router.batch import run_batch_chunks

    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"])
    decode = servers["decode-0/0"]
    stop = asyncio.Event()
    got = []
    try:
        async for chunk in run_batch_chunks(d, bench(20, output_len=64), 2, stop=stop):
            got.extend(chunk)
            if len(got) >= 3 and not decode.hang:
                decode.hang = True  # the next requests never finish: in flight when the stop comes
                for _ in range(200):
                    if decode.in_flight == 2:
                        break
                    await asyncio.sleep(0.01)
                assert decode.in_flight == 2
                stop.set()
    finally:
        await d.close()
    ok = [r for r in got if r.status == "ok"]
    assert len(ok) >= 3 and sorted(r.index for r in got) == list(range(20)), "one result per request"
    hung = decode.bodies[len(ok):]
    assert len(hung) == 2 and sorted(decode.aborted) == sorted(b["rid"] for b in hung), \
        "the requests in flight were not aborted"
    # every other request failed, the ones the engine was running told apart from those never sent
    failed = {r.error: {x.index for x in got if x.error == r.error} for r in got if r.status != "ok"}
    assert set(failed) == {CUT_OFF_IN_FLIGHT, NEVER_SENT}, failed
    assert failed[CUT_OFF_IN_FLIGHT] == {b["input_ids"][3] for b in hung}
    assert len(failed[NEVER_SENT]) == 20 - len(ok) - 2


async def test_a_stopped_batch_keeps_every_request_the_engine_finished_before_its_abort(servers):
    """The stop aborts on the engines first, then reads what they already sent: a request the decode finished
    whose answer had not reached the router at the stop stays completed (Ctrl-C under load, issue 22)."""
    from orchestrator.router.batch import run_batch_chunks

    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"])
    decode = servers["decode-0/0"]
    stop = asyncio.Event()
    got = []
    try:
        async for chunk in run_batch_chunks(d, bench(20, output_len=8), 4, stop=stop, stop_drain_s=5.0):
            got.extend(chunk)
            if len(got) >= 3 and not decode.send_delay_s:
                decode.send_delay_s = 0.5  # finished on the engine, not yet read when the stop comes
                done_before = decode.finished
                for _ in range(200):
                    if decode.finished - done_before >= 2:
                        break
                    await asyncio.sleep(0.01)
                stop.set()
    finally:
        await d.close()
    ok = [r for r in got if r.status == "ok"]
    assert len(ok) == decode.finished < 20, f"kept {len(ok)}, the decode finished {decode.finished}"
    assert {r.error for r in got if r.status != "ok"} <= {CUT_OFF_IN_FLIGHT, NEVER_SENT}
    unread = [b["input_ids"][3] for b in decode.bodies if b["rid"] in decode.aborted]
    assert unread, "the stop did not abort on the engine first"
    cut = {r.index for r in got if r.error == CUT_OFF_IN_FLIGHT}
    assert cut <= set(unread) and set(unread) - cut <= {r.index for r in ok}, (cut, unread)


async def test_a_batch_reaches_its_engine_while_the_rest_of_it_is_still_being_started(servers):
    """The batch opens one request per event-loop turn: the engine reads the first request while others still wait
    to be started, not the whole batch in a step once every request's connection is open (docs/router.md, "The
    opening of a batch"). Started all at once, every request left the queue before the engine read any."""
    from orchestrator.observe.metrics import RouterMetrics
    from orchestrator.router.batch import run_batch_chunks

    metrics = RouterMetrics("burst", "1p1d")
    d = await make_dispatcher(servers, ["prefill-0/0", "decode-0/0"])
    d.metrics = metrics
    queued = {"run_id": "burst", "layout": "1p1d", "state": "queued"}
    queued_at_arrival: list[float] = []
    servers["prefill-0/0"].on_request = lambda: queued_at_arrival.append(
        metrics.registry.get_sample_value("pdorch_requests_in_flight", queued))
    got = []
    try:
        async for chunk in run_batch_chunks(d, bench(64), 64):
            got.extend(chunk)
    finally:
        await d.close()
    assert len(got) == 64 and all(r.status == "ok" for r in got)
    assert queued_at_arrival[0] > 0, "every request was started before the engine read the first one"
    assert queued_at_arrival[-1] == 0
