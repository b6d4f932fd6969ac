"""`serve`: the deployment of `bench` kept up as an OpenAI gateway until SIGTERM / Ctrl-C.

place (Deployment, as bench) -> ready workers -> one real request through every prefill-decode pair (the first
request on a cold NIXL pair can stall for tens of seconds) -> one ready line with the gateway URL -> serve ->
on SIGTERM/SIGINT: drain (wait until no worker runs, queues or transfers a request; bounded) -> tear down.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.config import RunConfig
from orchestrator.records import WorkerEndpoint
from orchestrator.run.deployment import Deployment, with_free_router_port
from orchestrator.run.driver import BenchInterrupted, check_stop, stop_reason

WARMUP_INPUT_IDS = [10, 11, 12, 13]  # SGLang's own PD warm-up prompt
# SGLang's gauges of requests a server still holds: running, waiting, and (PD) in bootstrap or KV transfer
BUSY_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_prefill_bootstrap_queue_reqs",
               "sglang:num_prefill_inflight_queue_reqs", "sglang:num_decode_prealloc_queue_reqs",
               "sglang:num_decode_transfer_queue_reqs")


@dataclass(frozen=True)
class PairWarmup:
    prefill: str
    decode: str
    seconds: float
    error: str | None = None


async def _warm_pair(client: httpx.AsyncClient, prefill: WorkerEndpoint | None, decode: WorkerEndpoint,
                     timeout_s: float) -> PairWarmup:
    """One real /generate through `prefill` -> `decode` (aggregated: the worker alone), as mini_lb sends it."""
    body: dict = {"input_ids": WARMUP_INPUT_IDS, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True,
                                                                     "temperature": 0},
                  "rid": f"pdo-warmup-{uuid.uuid4().hex[:12]}"}
    started = time.monotonic()
    try:
        if prefill is None:
            legs = [client.post(decode.url + "/generate", json=body, timeout=timeout_s)]
        else:
            body.update(bootstrap_host=prefill.bootstrap_host, bootstrap_port=prefill.bootstrap_port,
                        bootstrap_room=random.randint(1, 2**63 - 1))
            legs = [client.post(prefill.url + "/generate", json=body, timeout=timeout_s),
                    client.post(decode.url + "/generate", json=body, timeout=timeout_s)]
        for r in await asyncio.gather(*legs):
            r.raise_for_status()
        error = None
    except (httpx.HTTPError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    return PairWarmup(prefill.name if prefill else "-", decode.name, time.monotonic() - started, error)


async def warm_pairs(endpoints: list[WorkerEndpoint], timeout_s: float = 300) -> list[PairWarmup]:
    """Every prefill x decode pair (or every aggregated worker) answers one request, all pairs at once."""
    prefills = [e for e in endpoints if e.role == "prefill"]
    others = [e for e in endpoints if e.role != "prefill"]
    pairs = [(p, d) for p in prefills for d in others] if prefills else [(None, d) for d in others]
    async with httpx.AsyncClient() as client:
        return list(await asyncio.gather(*(_warm_pair(client, p, d, timeout_s) for p, d in pairs)))


def busy_requests(endpoints: list[WorkerEndpoint]) -> int:
    """Requests the workers still hold (SGLang's gauges from /metrics); unreachable workers count as idle."""
    total = 0.0
    for e in endpoints:
        try:
            text = httpx.get(e.url + "/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        for family in text_string_to_metric_families(text):
            total += sum(s.value for s in family.samples if s.name in BUSY_GAUGES)
    return int(total)


def drain(endpoints: list[WorkerEndpoint], timeout_s: float, say: Callable[[str], None]) -> int:
    """Wait until no worker holds a request (or `timeout_s`); returns what was still held at the end."""
    deadline = time.monotonic() + timeout_s
    busy = busy_requests(endpoints)
    while busy and time.monotonic() < deadline:
        time.sleep(0.2)
        busy = busy_requests(endpoints)
    say("drained: no request in flight" if not busy else
        f"drain timed out after {timeout_s:g} s: {busy} request(s) still held by workers are cut off")
    return busy


def run_serve(cfg: RunConfig, drain_s: float = 30.0, say: Callable[[str], None] = print) -> int:
    """Place, warm every pair, print the ready line, serve until SIGTERM/SIGINT, drain, tear down."""
    cfg = with_free_router_port(cfg)
    started = time.monotonic()
    deadline_at = time.time() + cfg.benchmark.deadline_s
    endpoints: list[WorkerEndpoint] = []
    with Deployment(cfg, f"{cfg.name}-serve-{uuid.uuid4().hex[:6]}", deadline_at) as deployment:
        try:
            deployment.place()
            endpoints = deployment.wait_ready()
            say(f"workers ready in {time.monotonic() - started:.1f} s: "
                + ", ".join(f"{e.name} {e.url}" for e in sorted(endpoints, key=lambda e: e.name)))
            warmed = asyncio.run(warm_pairs(endpoints))
            for w in warmed:
                say(f"pair warm-up {w.prefill} -> {w.decode}: {w.seconds * 1000:.0f} ms"
                    + (f" FAILED ({w.error})" if w.error else ""))
            failed = [w for w in warmed if w.error]
            if failed:
                say(f"serve: {len(failed)} of {len(warmed)} pair warm-ups failed; not serving (see the engine logs)")
                return 1
            say(f"ready: OpenAI gateway {deployment.url}/v1 (model {cfg.model.name}) after "
                f"{time.monotonic() - started:.1f} s; SIGTERM or Ctrl-C stops it")
            sys.stdout.flush()
            while True:
                time.sleep(0.5)
                check_stop()
        except (BenchInterrupted, KeyboardInterrupt):
            say(f"stopping ({stop_reason() or 'interrupted'}): draining in-flight requests (up to {drain_s:g} s)")
            left = drain(endpoints, drain_s, say) if endpoints else 0
            say("serve: stopped; tearing down the workers and the router")
            return 0 if not left else 3
