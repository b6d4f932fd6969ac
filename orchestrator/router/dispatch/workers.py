"""The dispatcher's workers (WorkerPool): the set it follows from the registry, the pair it picks for an attempt (the
routing policies choose), and each worker's legs in flight and suspect marks."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Iterable

import aiohttp

from orchestrator.records import WorkerEndpoint
from orchestrator.router.dispatch.engine_client import EngineClient
from orchestrator.router.dispatch.pairs import Pair, Progress
from orchestrator.router.dispatch.policies import RequestShape, RoutingPolicy, WorkerState, eligible, make_policy
from orchestrator.router.dispatch.settings import DispatchSettings
from orchestrator.router.ingress_metrics import MetricsSink


class WorkerPool:
    """The worker set of one router replica and what is in flight on each worker (PDDispatcher is one)."""

    def __init__(self, settings: DispatchSettings | None = None, mode: str = "pd", metrics: MetricsSink | None = None):
        if mode not in ("pd", "aggregated"):
            raise ValueError(f"layout.mode={mode!r}: dispatcher supports 'pd' or 'aggregated'")
        self.settings = settings or DispatchSettings()
        self.mode = mode
        self.metrics = metrics
        self.workers: dict[str, WorkerState] = {}
        self._policies: dict[str, RoutingPolicy] = {}
        self._rooms_in_flight: set[int] = set()
        self._rng = random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._engine_client: EngineClient | None = None
        self._background: set[asyncio.Task] = set()
        self.aborts_sent = 0  # for tests and the benchmark: aborts actually delivered

    def set_workers(self, endpoints: Iterable[WorkerEndpoint]) -> None:
        """Follow the registry: keep state of known workers, add new ones (healthy), drop gone ones."""
        fresh: dict[str, WorkerState] = {}
        for ep in endpoints:
            old = self.workers.get(ep.name)
            if old is not None and old.endpoint == ep:
                fresh[ep.name] = old
            else:
                fresh[ep.name] = WorkerState(ep)
        self.workers = fresh

    def _policy(self, role: str) -> RoutingPolicy:
        if role not in self._policies:
            self._policies[role] = make_policy(self.settings.policy, role, self.settings.seed)
        return self._policies[role]

    def pick_pair(self, request: RequestShape | None = None) -> Pair:
        """A pair for the next attempt; raises NoWorkerError when a role has no usable worker."""
        now = time.monotonic()
        ws = list(self.workers.values())
        request = request or RequestShape()
        total = request.prompt_tokens + request.max_new_tokens
        if self.mode == "aggregated":
            worker = self._policy("aggregated").pick(eligible(ws, "aggregated", now), request)
            return Pair(decode=worker, decode_tokens=total)
        prefill_policy = self._policy("prefill")
        prefill = prefill_policy.pick(eligible(ws, "prefill", now), request)
        new_tokens = getattr(prefill_policy, "new_tokens", None)  # a prefix-aware policy knows what is cached
        prefill_tokens = new_tokens(prefill, request) if new_tokens is not None else request.prompt_tokens
        decode = self._policy("decode").pick(eligible(ws, "decode", now), request)
        return Pair(decode=decode, prefill=prefill, prefill_tokens=prefill_tokens, decode_tokens=total)

    def set_progress(self, progress: Progress | None, state: str | None) -> None:
        if progress is None or progress.state == state:
            return
        if self.metrics is not None:
            self.metrics.state_change(progress.state, state)
        progress.state = state

    def mark_suspect(self, w: WorkerState) -> None:
        w.failures += 1
        w.suspect_until = time.monotonic() + self.settings.suspect_s

    def leg_start(self, w: WorkerState, tokens: int = 0) -> None:
        w.outstanding += 1
        w.outstanding_tokens += tokens
        if self.metrics is not None:
            self.metrics.worker_outstanding(w.endpoint.role, w.name, w.outstanding)

    def leg_done(self, w: WorkerState, tokens: int = 0) -> None:
        w.outstanding -= 1
        w.outstanding_tokens -= tokens
        if self.metrics is not None:
            self.metrics.worker_outstanding(w.endpoint.role, w.name, w.outstanding)
