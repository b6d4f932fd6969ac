"""A running `serve`'s state: what it placed, the layout it serves now, its warm-ups and layout changes, and every
line it said (the control socket streams them to `serve apply` / `serve down`); `status()` is `serve status`."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from typing import TYPE_CHECKING, Callable, Iterator

from orchestrator.config import RunConfig
from orchestrator.records import WorkerEndpoint
from orchestrator.run.serving.warmup import PairWarmup, engine_counts

if TYPE_CHECKING:
    from orchestrator.run.deployment import Deployment


class Service:
    """What a running `serve` holds: the deployment, the layout it serves now, its pair warm-ups, layout changes,
    and every line it said (the control socket streams them to `serve apply` / `serve down`)."""

    def __init__(self, cfg: RunConfig, drain_s: float, say: Callable[[str], None]):
        self.cfg = cfg
        self.drain_s = drain_s
        self.run_id = f"{cfg.name}-serve-{uuid.uuid4().hex[:6]}"
        self.started_at = time.time()
        self.ready_at: float | None = None
        self.deployment: Deployment | None = None
        self.warmups: list[PairWarmup] = []
        self.changes: list[dict] = []  # one summary per applied layout change
        self.readmissions: list[dict] = []  # replicas Serve restarted, admitted after their pair warm-ups
        self.change_lock = threading.Lock()  # one layout change at a time
        self.phase = "starting"  # starting | serving | stopping
        self.rc: int | None = None  # set once torn down
        self.stop_requested: str | None = None  # `serve down`'s reason, seen by the serving loop
        self._print = say
        self._lines: list[str] = []
        self._said = threading.Condition()

    def say(self, line: str) -> None:
        with self._said:
            self._lines.append(line)
            self._said.notify_all()
        self._print(line)

    def request_stop(self, reason: str) -> None:
        """Stop as on SIGTERM: while serving, the loop sees it within 0.5 s; while starting, by the signal itself
        (placement and the readiness wait only look at signals)."""
        self.stop_requested = reason
        if self.phase == "starting":
            os.kill(os.getpid(), signal.SIGTERM)

    def finish(self, rc: int) -> None:
        with self._said:
            self.rc = rc
            self._said.notify_all()

    def lines_from(self, start: int) -> Iterator[str]:
        """The lines said from index `start` on, as they come, until the service has finished."""
        at = start
        while True:
            with self._said:
                while at >= len(self._lines) and self.rc is None:
                    self._said.wait(1.0)
                fresh, at, done = self._lines[at:], len(self._lines), self.rc is not None
            yield from fresh
            if done:
                return

    def line_count(self) -> int:
        with self._said:
            return len(self._lines)

    @property
    def gateway(self) -> str:
        return f"http://{self.cfg.router.host}:{self.cfg.router.port}"

    def registered(self) -> list[tuple[WorkerEndpoint, str]]:
        """Every worker in the registry with its routing state (routed | held | retired)."""
        import ray

        from orchestrator.cluster.registry import get_registry

        return ray.get(get_registry().entries.remote(), timeout=30)

    def status(self) -> dict:
        """What `serve status` shows: gateway, uptime, layout, workers per role with state and request counts, the
        pair warm-ups, the layout changes, Serve's applications."""
        base = {"name": self.cfg.name, "run_id": self.run_id, "phase": self.phase, "gateway": self.gateway, "model": self.cfg.model.name,
                "simulated": self.cfg.simulated, "layout": self.cfg.layout.describe(),
                "uptime_s": round(time.time() - self.started_at, 1),
                "ready_after_s": round(self.ready_at - self.started_at, 1) if self.ready_at else None,
                "workers": [], "pair_warmups": [w.__dict__ for w in self.warmups], "changes": self.changes,
                "readmissions": self.readmissions,
                "applications": {}}
        if self.deployment is None or self.deployment.session is None:
            return base  # not connected to the cluster yet
        from ray import serve

        workers = []
        for endpoint, state in sorted(self.registered(), key=lambda item: (item[0].role != "prefill", item[0].name)):
            counts = engine_counts(endpoint)
            workers.append({"name": endpoint.name, "role": endpoint.role, "state": state, "url": endpoint.url,
                            "node_ip": endpoint.node_ip, "gpu_ids": list(endpoint.gpu_ids),
                            "requests": counts[0] if counts else None, "in_flight": counts[1] if counts else None})
        apps = {name: str(getattr(app.status, "value", app.status))
                for name, app in serve.status().applications.items()}
        return {**base, "workers": workers, "applications": apps}

    def routed_endpoints(self) -> list[WorkerEndpoint]:
        return [e for e, state in self.registered() if state != "held"]
