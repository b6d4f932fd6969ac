"""The one engine interface: what a worker needs to launch, watch and stop one engine server process.

A backend (sim | sglang) turns (config, role, group, placement) into an `EngineLaunch`: argv + env +
the URLs it will serve. `EngineProcess` runs any launch the same way: its own process group, logs to
a file, readiness by polling `/health`, stop by signalling the whole group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

from orchestrator.config import RunConfig, WorkerGroup


@dataclass(frozen=True)
class WorkerPlacement:
    """Where one engine server runs: node IP, ports chosen for it, GPU ids Ray assigned."""

    role: str  # prefill | decode | aggregated
    group_index: int
    replica_index: int
    host: str  # address the server binds to
    advertise_host: str  # address others use to reach it (routable node IP)
    port: int
    bootstrap_port: int | None = None
    gpu_ids: tuple[int, ...] = ()
    node_ip: str = "127.0.0.1"
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None


def engine_addresses(cfg: RunConfig, node_ip: str) -> tuple[str, str]:
    """(bind, advertise): where an engine server on this node listens, and where peers reach it.

    A local cluster is one machine: engines listen on `cluster.local.bind_host` (loopback) and are reached
    there. On a real cluster peers reach them at `transfer.host_ip` or the Ray node IP, and they listen
    on that address only unless `engine.bind_host` names another (e.g. 0.0.0.0).
    """
    if cfg.cluster.is_local:
        return cfg.cluster.local.bind_host, cfg.cluster.local.bind_host
    advertise = cfg.transfer.host_ip or node_ip
    return cfg.engine.bind_host or advertise, advertise


@dataclass
class EngineLaunch:
    argv: list[str]
    env: dict[str, str]
    url: str
    bootstrap_port: int | None = None
    extra: dict[str, str] = field(default_factory=dict)


class EngineBackend(Protocol):
    name: str

    def build_launch(self, cfg: RunConfig, group: WorkerGroup, placement: WorkerPlacement) -> EngineLaunch:
        """The exact command line and environment for one server."""
        ...


def backend_for(cfg: RunConfig) -> EngineBackend:
    if cfg.engine.kind == "sim":
        from orchestrator.engines.sim.backend import SimBackend

        return SimBackend()
    from orchestrator.engines.sglang.launch import SglangBackend

    return SglangBackend()


class EngineStartError(RuntimeError):
    pass


class EngineProcess:
    """One engine server process in its own session; logs go to `log_path`."""

    def __init__(self, launch: EngineLaunch, log_path: Path):
        self.launch = launch
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.ready_at: float | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        env = {**os.environ, **self.launch.env}
        self.started_at = time.time()
        self.proc = subprocess.Popen(
            self.launch.argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.2) -> float:
        """Block until GET /health is 200; return seconds from start. Raise with the log tail on failure."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise EngineStartError(
                        f"engine exited with code {self.proc.returncode if self.proc else '?'} before it was "
                        f"healthy; log {self.log_path}:\n{self.log_tail()}"
                    )
                try:
                    if client.get(self.launch.url + "/health").status_code == 200:
                        self.ready_at = time.time()
                        return self.ready_at - (self.started_at or self.ready_at)
                except httpx.HTTPError:
                    pass
                time.sleep(poll_s)
        raise EngineStartError(
            f"engine at {self.launch.url} not healthy after {timeout_s:.0f}s; log {self.log_path}:\n"
            f"{self.log_tail()}"
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left: no orphan engine processes."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                # children of the group may outlive the leader; make sure they are gone too
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
