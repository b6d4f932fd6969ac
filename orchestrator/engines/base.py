"""The one engine interface: what a worker needs to launch, watch and stop one engine server process.

(config, group, placement) -> EngineBackend.build_launch -> EngineLaunch (argv, env, URLs) -> EngineProcess.
A backend (sim | sglang, looked up by engine.kind in `orchestrator.engines.registry`) owns everything that
differs between engines: launch command, start-up timeout, readiness, node-rank processes, PD timeouts.
`EngineProcess` runs any launch the same way: its own process group, logs to a file, readiness by polling
`/health`, stop by signalling the whole group.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import httpx

from orchestrator.config import RunConfig, WorkerGroup
from orchestrator.config.server_spec import PdTimeouts, ServerSpec, server_spec
from orchestrator.process import ManagedProcess, ProcessError, ProcessTimeout
from orchestrator.records import Role


@dataclass(frozen=True)
class WorkerPlacement:
    """Where one engine server runs: node IP, ports chosen for it, GPU ids Ray assigned."""

    role: Role
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
    """One server's launch: command line, environment, and where it answers once started."""

    argv: list[str]
    env: dict[str, str]
    url: str
    role: Role = "aggregated"
    node_rank: int = 0  # > 0: a node rank of a multi-node server (no HTTP server of its own)
    bootstrap_port: int | None = None  # prefill: the PD bootstrap server's port
    bootstrap_url: str | None = None  # prefill: the PD bootstrap server's base URL
    worker_name: str | None = None  # '<group name>/<replica>' when the backend names its workers


class EngineStartError(RuntimeError):
    pass


class EngineStartTimeout(EngineStartError):
    """The engine still runs but did not become ready within its ready timeout."""


class EngineProcess:
    """One engine server process (a ManagedProcess) plus its launch: ready when GET /health answers 200."""

    def __init__(self, launch: EngineLaunch, log_path: Path):
        self.launch = launch
        self.log_path = Path(log_path)
        self.process = ManagedProcess(launch.argv, self.log_path, what="engine")
        self.ready_at: float | None = None

    @property
    def proc(self):
        """The subprocess.Popen, once started."""
        return self.process.popen

    @property
    def started_at(self) -> float | None:
        return self.process.started_at

    def start(self) -> None:
        self.process.env = {**os.environ, **self.launch.env}
        self.process.start()

    def alive(self) -> bool:
        return self.process.alive()

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.2) -> float:
        """Block until GET /health is 200; return seconds from start. EngineStartError with the log tail."""
        with httpx.Client(timeout=5.0) as client:

            def healthy() -> bool:
                try:
                    return client.get(self.launch.url + "/health").status_code == 200
                except httpx.HTTPError:
                    return False

            try:
                took = self.process.wait_ready(healthy, timeout_s, poll_s, where=self.launch.url)
            except ProcessTimeout as exc:
                raise EngineStartTimeout(str(exc)) from None
            except ProcessError as exc:
                raise EngineStartError(str(exc)) from None
        self.ready_at = time.time()
        return took

    def log_tail(self, lines: int = 20) -> str:
        return self.process.log_tail(lines)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left: no orphan engine processes."""
        self.process.stop(grace_s)


class EngineBackend(ABC):
    """What differs between engines; a worker asks its backend and never branches on engine.kind."""

    name: str

    @abstractmethod
    def build_launch(self, cfg: RunConfig, group: WorkerGroup, placement: WorkerPlacement) -> EngineLaunch:
        """The exact command line and environment for one server (one node rank of it)."""

    def pd_timeouts(self, cfg: RunConfig) -> PdTimeouts:
        """The PD waits the server is given, sized from the run's deadline."""
        return PdTimeouts.for_deadline(cfg.benchmark.deadline_s)

    def server_spec(self, cfg: RunConfig, role: Role, group: WorkerGroup) -> ServerSpec:
        """The settings every server of `group` in `role` is launched with (its PD waits from pd_timeouts)."""
        return server_spec(cfg, role, group, self.pd_timeouts(cfg))

    def rank_processes(self, group: WorkerGroup) -> int:
        """Node ranks > 0 of one server that need a process of their own (on their own node)."""
        return 0

    def wait_ready(self, process: EngineProcess, timeout_s: float) -> None:
        """Block until the started server takes traffic; raise with the reason when it does not."""
        process.wait_healthy(timeout_s)

    def compile_cache_state(self, cfg: RunConfig, launch: EngineLaunch) -> str:
        """Whether this server starts with its compile caches warm for its shape: 'warm' | 'cold' ('n/a': none)."""
        return "n/a"

    def record_ready(  # noqa: B027 (a hook: a backend without compile caches has nothing to record)
        self, cfg: RunConfig, launch: EngineLaunch, ready_s: float | None, cache_state: str) -> None:
        """After the server became ready: remember that its caches now hold its shape (no caches: nothing)."""
