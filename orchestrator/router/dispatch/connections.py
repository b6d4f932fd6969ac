"""The dispatcher's HTTP connections (EngineConnections): the engine-leg client and the aiohttp session, health probes
of every worker, and aborts sent in the background."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from orchestrator.router.dispatch.engine_client import EngineClient
from orchestrator.router.dispatch.policies import WorkerState
from orchestrator.router.dispatch.workers import WorkerPool

log = logging.getLogger(__name__)


class EngineConnections(WorkerPool):
    """Sessions to the workers, their health, and aborts (closed by close())."""

    @property
    def session(self) -> aiohttp.ClientSession:
        # Created lazily: an aiohttp session belongs to the event loop it was made in.
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.settings.max_connections, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None), raise_for_status=False
            )
        return self._session

    @property
    def engine_client(self) -> EngineClient:
        # The two legs of every request: a lean keep-alive client (aiohttp costs ~0.07-0.09 ms more per leg).
        if self._engine_client is None:
            self._engine_client = EngineClient()
        return self._engine_client

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(list(self._background), timeout=self.settings.abort_timeout_s + 1)
        if self._engine_client is not None:
            await self._engine_client.close()
            self._engine_client = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def check_health(self) -> dict[str, bool]:
        """GET /health on every worker concurrently; updates and returns each worker's health."""

        async def one(w: WorkerState) -> tuple[str, bool]:
            try:
                async with self.session.get(
                    w.endpoint.url + "/health", timeout=aiohttp.ClientTimeout(total=self.settings.health_timeout_s)
                ) as r:
                    return w.name, r.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return w.name, False

        results = dict(await asyncio.gather(*(one(w) for w in list(self.workers.values()))))
        for name, ok in results.items():
            w = self.workers.get(name)
            if w is None:
                continue
            # One slow probe under load is not death: only consecutive failures take a worker out.
            w.health_failures = 0 if ok else w.health_failures + 1
            w.healthy = w.health_failures < self.settings.unhealthy_after_failures
        return results

    def abort_in_background(self, w: WorkerState, rid: str) -> None:
        """POST /abort_request for `rid` without making the caller wait (the worker may be hung)."""

        async def abort() -> None:
            try:
                async with self.session.post(
                    w.endpoint.url + "/abort_request", json={"rid": rid},
                    timeout=aiohttp.ClientTimeout(total=self.settings.abort_timeout_s),
                ) as r:
                    await r.read()
                    if r.status == 200:
                        self.aborts_sent += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                log.info("abort of %s on %s not delivered: %r", rid, w.name, exc)

        task = asyncio.get_running_loop().create_task(abort())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
