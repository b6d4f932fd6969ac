"""Pair warm-up and drain, by the engines' own answers: one real request through each prefill-decode pair (the
first request on a cold NIXL pair can stall for tens of seconds), and SGLang's gauges of requests a server holds."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.records import WorkerEndpoint

WARMUP_INPUT_IDS = [10, 11, 12, 13]  # SGLang's own PD warm-up prompt
# SGLang's gauges of requests a server still holds: running, waiting, and (PD) in bootstrap or KV transfer
BUSY_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_prefill_bootstrap_queue_reqs",
               "sglang:num_prefill_inflight_queue_reqs", "sglang:num_decode_prealloc_queue_reqs",
               "sglang:num_decode_transfer_queue_reqs")
REQUESTS_COUNTER = "sglang:num_requests_total"


@dataclass(frozen=True)
class PairWarmup:
    prefill: str
    decode: str
    seconds: float
    error: str | None = None

    def line(self) -> str:
        return (f"pair warm-up {self.prefill} -> {self.decode}: {self.seconds * 1000:.0f} ms"
                + (f" FAILED ({self.error})" if self.error else ""))


async def generate_through(client: httpx.AsyncClient, prefill: WorkerEndpoint | None, decode: WorkerEndpoint,
                           body: dict, timeout_s: float, bootstrap_room: int | None = None) -> None:
    """One /generate `body` through `prefill` -> `decode` (aggregated: the worker alone), as mini_lb sends it: both
    legs at once, with the prefill's bootstrap address and a room (random unless given); raises on an HTTP error."""
    if prefill is None:
        legs = [client.post(decode.url + "/generate", json=body, timeout=timeout_s)]
    else:
        room = random.randint(1, 2**63 - 1) if bootstrap_room is None else bootstrap_room
        body = {**body, "bootstrap_host": prefill.bootstrap_host, "bootstrap_port": prefill.bootstrap_port,
                "bootstrap_room": room}
        legs = [client.post(prefill.url + "/generate", json=body, timeout=timeout_s),
                client.post(decode.url + "/generate", json=body, timeout=timeout_s)]
    for r in await asyncio.gather(*legs):
        r.raise_for_status()


async def _warm_pair(client: httpx.AsyncClient, prefill: WorkerEndpoint | None, decode: WorkerEndpoint,
                     timeout_s: float) -> PairWarmup:
    """One real /generate through `prefill` -> `decode` (aggregated: the worker alone), as mini_lb sends it."""
    body: dict = {"input_ids": WARMUP_INPUT_IDS, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True,
                                                                     "temperature": 0},
                  "rid": f"pdo-warmup-{uuid.uuid4().hex[:12]}"}
    started = time.monotonic()
    try:
        await generate_through(client, prefill, decode, body, timeout_s)
        error = None
    except (httpx.HTTPError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    return PairWarmup(prefill.name if prefill else "-", decode.name, time.monotonic() - started, error)


def pairs_touching(endpoints: Iterable[WorkerEndpoint], new: set[str] | None = None
                   ) -> list[tuple[WorkerEndpoint | None, WorkerEndpoint]]:
    """Every prefill x decode pair (aggregated: every worker alone); with `new`, only pairs with a worker named
    in it (the pairs a layout change adds)."""
    endpoints = list(endpoints)
    prefills = [e for e in endpoints if e.role == "prefill"]
    others = [e for e in endpoints if e.role != "prefill"]
    pairs: list[tuple[WorkerEndpoint | None, WorkerEndpoint]]
    pairs = [(p, d) for p in prefills for d in others] if prefills else [(None, d) for d in others]
    if new is None:
        return pairs
    return [(p, d) for p, d in pairs if d.name in new or (p is not None and p.name in new)]


async def warm_pairs(pairs: list[tuple[WorkerEndpoint | None, WorkerEndpoint]],
                     timeout_s: float = 300) -> list[PairWarmup]:
    """Each pair answers one request, all pairs at once."""
    async with httpx.AsyncClient() as client:
        return list(await asyncio.gather(*(_warm_pair(client, p, d, timeout_s) for p, d in pairs)))


def engine_counts(endpoint: WorkerEndpoint) -> tuple[int, int] | None:
    """(requests the engine counted, requests it holds now) from its /metrics; None when it does not answer."""
    try:
        text = httpx.get(endpoint.url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    total = held = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == REQUESTS_COUNTER:
                total += s.value
            elif s.name in BUSY_GAUGES:
                held += s.value
    return int(total), int(held)


def busy_requests(endpoints: Iterable[WorkerEndpoint]) -> int:
    """Requests the workers still hold (SGLang's gauges from /metrics); unreachable workers count as idle."""
    return sum((engine_counts(e) or (0, 0))[1] for e in endpoints)


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
