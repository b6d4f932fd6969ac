"""PD router deployment: `client -> PDRouter (HTTP on router.port, or handle) -> RouterCore -> {prefill, decode}`.

The thin Serve class: it follows the worker registry (endpoints appear and disappear as worker replicas
start and stop), owns the replica's RouterCore and metrics exporter, serves the HTTP API itself on
router.host:router.port (`orchestrator.router.http_app.serve_http`: no Serve proxy, no Ray hop per
request; replicas on one node share the port), and exposes the bench driver's handle API (`wait_ready`,
then `generate_batch_chunks` or `generate_batch` with a stream=True handle). The state and logic without
Serve are `orchestrator.router.core`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any, AsyncIterator

from ray import serve

from orchestrator.config import RunConfig
from orchestrator.records import BenchRequest, RequestResult, WorkerEndpoint
from orchestrator.router.batch import run_batch, run_batch_chunks
from orchestrator.router.core import RouterCore
from orchestrator.router.http_app import serve_http

if TYPE_CHECKING:
    from orchestrator.observe.metrics import RouterMetrics

log = logging.getLogger(__name__)

REGISTRY_POLL_S = 1.0
REGISTRY_TIMEOUT_S = 10.0  # a registry call that hangs (actor restarting, GCS hiccup) must not freeze the view
RESULT_FLUSH_S = 0.05  # batch results finished within this window travel as one Serve item


def _make_metrics(cfg: RunConfig, run_id: str) -> tuple[RouterMetrics, Any]:
    """RouterMetrics plus its own exporter on a free port, listed in the run's Prometheus file_sd."""
    from orchestrator.observe.file_sd import serve_metrics
    from orchestrator.observe.metrics import RouterMetrics

    metrics = RouterMetrics(run_id, cfg.layout.describe(), slo=cfg.benchmark.slo)
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


async def _start_failures(registry) -> dict[str, str]:
    """The workers whose replicas gave up starting their engines (none if the registry does not answer)."""
    try:
        return await asyncio.wait_for(registry.start_failures.remote(), REGISTRY_TIMEOUT_S)
    except Exception:  # a hung or dead registry: the readiness poll asks again
        return {}


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100_000)
class PDRouter:
    """One router replica: follows the registry, serves the HTTP API on router.port, answers the handle API."""

    async def __init__(self, cfg: RunConfig | dict, run_id: str = "run"):  # type: ignore[misc]  # Serve awaits it
        # async: Serve runs it on the replica's event loop, which the HTTP server and the follower share
        self.cfg = cfg if isinstance(cfg, RunConfig) else RunConfig.model_validate(cfg)
        self.metrics, self.exporter = _make_metrics(self.cfg, run_id)
        self.core = RouterCore(self.cfg, run_id, self.metrics)
        self._follower: asyncio.Task | None = None
        self._batch_stops: dict[str, asyncio.Event] = {}  # generate_batch_chunks' batch_id -> its stop
        self._ensure_following()
        self.http_server, self.http_task = await serve_http(self.core, self.cfg.router.host, self.cfg.router.port)

    def _ensure_following(self) -> None:
        if self._follower is None or self._follower.done():
            self._follower = asyncio.get_running_loop().create_task(self._follow_registry())

    async def _follow_registry(self) -> None:
        from orchestrator.cluster.registry import get_registry

        registry = get_registry()
        while True:
            try:
                version, endpoints = await asyncio.wait_for(registry.snapshot.remote(), REGISTRY_TIMEOUT_S)
                self.core.follow(version, endpoints)
                await self.core.maybe_check_health()
            except Exception as exc:  # keep following: a registry restart must not stop routing
                log.warning("router: registry poll failed: %r", exc)
                registry = get_registry()  # a handle to a dead registry would freeze the view for good
            await asyncio.sleep(REGISTRY_POLL_S)

    async def check_health(self) -> None:
        self._ensure_following()
        if self.http_task.done():  # Serve restarts a replica whose HTTP server died
            raise RuntimeError(f"router HTTP server on port {self.cfg.router.port} stopped: "
                               f"{self.http_task.exception() if not self.http_task.cancelled() else 'cancelled'}")

    async def wait_ready(self, expected: dict[str, int], timeout_s: float) -> list[WorkerEndpoint]:
        """Return once `expected` workers per role are registered and answer /health 200."""
        self._ensure_following()
        from orchestrator.cluster.registry import WorkersFailedToStart, get_registry

        registry = get_registry()
        deadline = time.monotonic() + timeout_s
        endpoints: list[WorkerEndpoint] = []
        while True:
            try:
                version, endpoints = await asyncio.wait_for(registry.snapshot.remote(), REGISTRY_TIMEOUT_S)
                self.core.follow(version, endpoints)
            except Exception as exc:  # a hung or dead registry: ask again (a new one if it died)
                log.warning("router: registry poll failed: %r", exc)
                registry = get_registry()
            if failures := await _start_failures(registry):
                raise WorkersFailedToStart("; ".join(failures[name] for name in sorted(failures)))
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

    async def generate_batch_chunks(self, requests: list[BenchRequest], max_in_flight: int,
                                    deadline_at: float | None,
                                    batch_id: str | None = None) -> AsyncIterator[list[RequestResult]]:
        """Lists of RequestResults in completion order, those finished within RESULT_FLUSH_S together
        (call with a stream=True handle); the bench driver's path: one Serve item per list, not per result.
        `stop_batch(batch_id)` ends it early: in-flight requests aborted, finished ones still sent, then every other
        one failed as cut off in flight or never sent."""
        self._ensure_following()
        stop = self._batch_stops.setdefault(batch_id, asyncio.Event()) if batch_id else None
        try:
            async for chunk in run_batch_chunks(self.core.dispatcher, requests, max_in_flight, deadline_at,
                                                flush_s=RESULT_FLUSH_S, stop=stop):
                yield chunk
        finally:
            if batch_id:
                self._batch_stops.pop(batch_id, None)

    async def stop_batch(self, batch_id: str) -> None:
        """The driver was interrupted: end that batch, keeping what finished (a stop may come before the batch)."""
        self._batch_stops.setdefault(batch_id, asyncio.Event()).set()

    async def generate_batch(self, requests: list[BenchRequest], max_in_flight: int,
                             deadline_at: float | None) -> AsyncIterator[RequestResult]:
        """One RequestResult per finished request, in completion order (call with a stream=True handle)."""
        self._ensure_following()
        async for result in run_batch(self.core.dispatcher, requests, max_in_flight, deadline_at):
            yield result

    async def workers(self) -> list[WorkerEndpoint]:
        self._ensure_following()
        return [w.endpoint for w in self.core.dispatcher.workers.values()]

    async def routing_view(self) -> dict:
        """The registry version this replica follows, the workers it routes to, its open legs per worker (routed
        or departed): what `serve apply` waits on before warming traffic in or removing a drained worker."""
        self._ensure_following()
        return {"registry_version": self.core.registry_version, "workers": sorted(self.core.dispatcher.workers),
                "legs_in_flight": self.core.legs_in_flight()}

    async def stop_admitting(self, reason: str) -> None:
        """The service stops (`serve down`, SIGTERM): new inference requests get a 503 naming `reason`."""
        self.core.stop_admitting(reason)

    async def cut_off_in_flight(self) -> int:
        """After a timed-out drain: end every request still held with a 503 (its legs aborted); how many."""
        return await self.core.cut_off_in_flight()

    def process_id(self) -> int:
        """This replica's pid (the router benchmarks read its CPU time from /proc)."""
        return os.getpid()

    def metrics_address(self) -> str | None:
        """host:port of this replica's Prometheus exporter (for the scrape file), None if not running."""
        return self.exporter.address if self.exporter is not None else None
