"""PD router deployment: `ingress (FastAPI) -> PDRouter -> RouterCore -> PDDispatcher -> {prefill, decode}`.

The thin Serve class: it follows the worker registry (endpoints appear and disappear as worker replicas
start and stop), owns the replica's RouterCore and metrics exporter, and exposes the bench driver's handle
API (`wait_ready`, then `generate_batch` with a stream=True handle). The HTTP routes are
`orchestrator.router.http_app`; the state and logic without Serve are `orchestrator.router.core`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import AsyncIterator

from fastapi import Request
from ray import serve

from orchestrator.config import RunConfig
from orchestrator.records import BenchRequest, RequestResult, WorkerEndpoint
from orchestrator.router.batch import run_batch
from orchestrator.router.core import RouterCore
from orchestrator.router.http_app import build_http_app

log = logging.getLogger(__name__)

REGISTRY_POLL_S = 1.0



def _replica_core(request: Request) -> RouterCore:
    """Under Serve the replica's PDRouter instance owns the core (a plain app carries it in app.state)."""
    core = getattr(request.app.state, "core", None)
    if core is not None:
        return core
    router = serve.get_replica_context().servable_object
    router._ensure_following()
    return router.core


http_app = build_http_app(_replica_core)


def _make_metrics(cfg: RunConfig, run_id: str):
    """RouterMetrics plus its own exporter on a free port, listed in the run's Prometheus file_sd."""
    from orchestrator.observe.file_sd import serve_metrics
    from orchestrator.observe.metrics import RouterMetrics

    metrics = RouterMetrics(run_id, cfg.layout.describe())
    try:
        replica = serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside Serve (uvicorn tests): one router per process
        replica = str(os.getpid())
    try:
        exporter = serve_metrics(metrics.registry, f"router-{replica}", run_id, cfg.metrics, port=0)
    except Exception as exc:  # metrics are an aid: a router without an exporter still routes
        log.warning("router metrics exporter not started: %r", exc)
        exporter = None
    return metrics, exporter


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100_000)
@serve.ingress(http_app)
class PDRouter:
    """One router replica: follows the registry, answers the handle API and the HTTP ingress."""

    def __init__(self, cfg: RunConfig | dict, run_id: str = "run"):
        self.cfg = cfg if isinstance(cfg, RunConfig) else RunConfig.model_validate(cfg)
        self.metrics, self.exporter = _make_metrics(self.cfg, run_id)
        self.core = RouterCore(self.cfg, run_id, self.metrics)
        self._follower: asyncio.Task | None = None
        try:  # Serve builds replicas inside their event loop; if not, the first call starts following
            self._ensure_following()
        except RuntimeError:
            pass

    def _ensure_following(self) -> None:
        if self._follower is None or self._follower.done():
            self._follower = asyncio.get_running_loop().create_task(self._follow_registry())

    async def _follow_registry(self) -> None:
        from orchestrator.cluster.registry import get_registry

        registry = get_registry()
        while True:
            try:
                version, endpoints = await registry.snapshot.remote()
                self.core.follow(version, endpoints)
                await self.core.maybe_check_health()
            except Exception as exc:  # keep following: a registry restart must not stop routing
                log.warning("router: registry poll failed: %r", exc)
            await asyncio.sleep(REGISTRY_POLL_S)

    async def check_health(self) -> None:
        self._ensure_following()  # Serve calls this soon after start: begin following right away

    async def wait_ready(self, expected: dict[str, int], timeout_s: float) -> list[WorkerEndpoint]:
        """Return once `expected` workers per role are registered and answer /health 200."""
        self._ensure_following()
        from orchestrator.cluster.registry import get_registry

        registry = get_registry()
        deadline = time.monotonic() + timeout_s
        while True:
            version, endpoints = await registry.snapshot.remote()
            self.core.follow(version, endpoints)
            health = await self.core.dispatcher.check_health()
            ready = [w.endpoint for w in self.core.dispatcher.workers.values() if health.get(w.name)]
            counts = {role: sum(1 for e in ready if e.role == role) for role in expected}
            if all(counts[role] >= n for role, n in expected.items()):
                return ready
            if time.monotonic() > deadline:
                registered = {role: sum(1 for e in endpoints if e.role == role) for role in expected}
                raise TimeoutError(
                    f"workers not ready after {timeout_s:.0f}s: expected {expected}, registered {registered}, "
                    f"healthy {counts}; see the engine logs (worker endpoint_info / runs/*/logs)"
                )
            await asyncio.sleep(0.5)

    async def generate_batch(self, requests: list[BenchRequest], max_in_flight: int,
                             deadline_at: float | None) -> AsyncIterator[RequestResult]:
        """One RequestResult per finished request, in completion order (call with a stream=True handle)."""
        self._ensure_following()
        async for result in run_batch(self.core.dispatcher, requests, max_in_flight, deadline_at):
            yield result

    async def workers(self) -> list[WorkerEndpoint]:
        self._ensure_following()
        return [w.endpoint for w in self.core.dispatcher.workers.values()]

    def metrics_address(self) -> str | None:
        """host:port of this replica's Prometheus exporter (for the scrape file), None if not running."""
        return self.exporter.address if self.exporter is not None else None
