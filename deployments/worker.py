"""EngineWorker: one Serve replica owns one engine server process (sim or SGLang) on its placement group.

Lifecycle: __init__ learns its GPUs from the placement group, picks free ports on its node, starts the
engine and returns at once (so Serve's "replica running" marks placement done, not engine start-up);
a background thread waits until the engine's /health is 200 and then registers the endpoint in the
worker registry under a name the registry hands out (unique among live replicas) and this replica's actor
as its owner (the registry drops the entry once that actor is gone). Serve's periodic `check_health` polls
/health and re-registers; `__del__` unregisters and stops the engine's process group.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace
from pathlib import Path

import httpx
import ray
from ray import serve
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.cluster.ports import free_port
from orchestrator.cluster.registry import get_registry
from orchestrator.config import RunConfig
from orchestrator.engines.allow_list import ALLOW_FROM_ENV, resolve
from orchestrator.engines.base import EngineProcess, EngineStartTimeout, WorkerPlacement, engine_addresses
from orchestrator.engines.registry import backend_for
from orchestrator.engines.sglang.log_phase import startup_phase
from orchestrator.plan.closedloop.startup_budget import engine_ready_timeout
from orchestrator.records import Role, WorkerEndpoint

logger = logging.getLogger("ray.serve")

# Serve may call check_health while /health is briefly slow under load (SGLang's probe waits for a
# scheduler step); only this many consecutive failures make the replica unhealthy.
HEALTH_FAILURES_TOLERATED = 3


@ray.remote(num_cpus=0)
def _bundle_gpu_ids() -> tuple[str, list[int]]:
    """Runs inside one placement-group bundle: the node and the GPU ids Ray assigned to that bundle."""
    ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    return ray.get_runtime_context().get_node_id(), [int(i) for i in ids]


def placement_gpu_ids(gpus_per_bundle: int) -> tuple[int, ...]:
    """GPU ids of every bundle of this replica's placement group, in bundle order, on this node.

    The replica itself holds no GPU (it sits in bundle 0 with num_gpus=0), so each bundle is asked
    through a tiny task; Ray sets CUDA_VISIBLE_DEVICES per task, which is how we learn physical ids.
    """
    pg = ray.util.get_current_placement_group()
    if pg is None:
        return ()
    here = ray.get_runtime_context().get_node_id()
    ids: list[int] = []
    for index in range(len(pg.bundle_specs)):
        strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)
        node, bundle_ids = ray.get(
            _bundle_gpu_ids.options(num_gpus=gpus_per_bundle, scheduling_strategy=strategy).remote()
        )
        if node == here:
            ids.extend(bundle_ids)
    return tuple(ids)


def _engine_log_dir(run_id: str) -> Path:
    """The Ray session log dir of this node (so `ray logs` and the dashboard see engine logs)."""
    try:
        base = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    except AttributeError:  # private API moved: fall back to the temp dir
        base = Path("/tmp")
    return base / "pd-engines" / run_id


@ray.remote(num_cpus=0)
class EngineRank:
    """Node rank k > 0 of a real SGLang server spanning nodes: owns that node's engine process.

    It holds its bundle's GPUs itself, so the ids Ray hands it are the ones the engine must use.
    """

    def __init__(self, cfg: RunConfig, placement: WorkerPlacement, log_path: str):
        group = getattr(cfg.layout, placement.role)[placement.group_index]
        ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
        placement = replace(placement, gpu_ids=tuple(int(i) for i in ids), node_ip=ray.util.get_node_ip_address())
        self.engine = EngineProcess(backend_for(cfg).build_launch(cfg, group, placement), Path(log_path))
        self.engine.start()

    def alive(self) -> bool:
        return self.engine.alive()

    def stop(self) -> None:
        self.engine.stop()


class EngineWorker:
    """A prefill, decode or aggregated engine server behind one Serve replica."""

    def __init__(self, cfg: RunConfig, role: Role, group_index: int, run_id: str, replica_index: int | None = None,
                 held: bool = False):
        """`replica_index`: the name's index when this replica is its own application (`serve`); `held`: register
        out of routing until the registry's `admit` (a replica added to a running service, warmed first)."""
        self.cfg = cfg
        self.held = held
        self.role = role
        self.group = getattr(cfg.layout, role)[group_index]
        self.group_index = group_index
        ctx = serve.get_replica_context()
        runtime = ray.get_runtime_context()
        # the registry entry belongs to this replica's actor: dropped when the actor is gone, even unannounced
        self.owner = runtime.get_actor_name() or None
        preferred = replica_index if replica_index is not None else ctx.rank.rank if ctx.rank is not None else 0
        # `serve`: the replica's own application is its slot; a later replica there replaces a dead one and waits
        # out of routing until `serve` has warmed its pairs (the registry holds it)
        self.slot = ctx.app_name if replica_index is not None else None
        self.name = ray.get(get_registry().claim_name.remote(ctx.deployment, preferred, self.owner), timeout=60)
        replica_index = int(self.name.rsplit("/", 1)[1])
        node_ip = ray.util.get_node_ip_address()
        bind_host, advertise = engine_addresses(cfg, node_ip)
        nnodes = self.group.nnodes
        gpus_per_bundle = self.group.gpus_per_node if nnodes > 1 else 1
        self.placement = WorkerPlacement(
            role=role,
            group_index=group_index,
            replica_index=replica_index,
            host=bind_host,
            advertise_host=advertise,
            port=free_port(bind_host),
            bootstrap_port=free_port(bind_host) if role == "prefill" else None,
            gpu_ids=placement_gpu_ids(gpus_per_bundle),
            node_ip=node_ip,
            nnodes=nnodes,
            dist_init_addr=f"{node_ip}:{free_port(bind_host)}" if nnodes > 1 else None,
        )
        self.backend = backend_for(cfg)
        self.launch = self.backend.build_launch(cfg, self.group, self.placement)
        if cfg.engine.allow_from:  # who may connect to the engine's ports: resolved here, enforced by the engine
            alive = [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]
            self.launch.env[ALLOW_FROM_ENV] = ",".join(str(n) for n in resolve(cfg.engine.allow_from, alive))
        safe_name = self.name.replace("/", "-")
        log_dir = _engine_log_dir(run_id)
        self.engine = EngineProcess(self.launch, log_dir / f"{safe_name}.log")
        # node ranks > 0 that need a process on their own node (real SGLang; the sim models them in one)
        self.ranks: list = []
        if self.backend.rank_processes(self.group):
            self.ranks = self._start_ranks(log_dir, safe_name, gpus_per_bundle)
        self.node_id = runtime.get_node_id()
        self.endpoint: WorkerEndpoint | None = None
        self.start_error: str | None = None
        self._health_failures = 0
        self._stopped = False
        self.cache_state = self.backend.compile_cache_state(cfg, self.launch)  # before it compiles anything
        self.ready_timeout = engine_ready_timeout(cfg)  # the job's start-up budget unless a field sets another
        self.engine.start()
        logger.info("%s: engine started (compile caches %s), log %s", self.name, self.cache_state,
                    self.engine.log_path)
        threading.Thread(target=self._await_healthy, name="engine-ready", daemon=True).start()

    def _start_ranks(self, log_dir: Path, safe_name: str, gpus_per_node: int) -> list:
        pg = ray.util.get_current_placement_group()
        ranks = []
        for rank in range(1, 1 + self.backend.rank_processes(self.group)):
            strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank)
            ranks.append(
                EngineRank.options(  # type: ignore[attr-defined]  # @ray.remote made it an actor class
                    num_gpus=gpus_per_node, scheduling_strategy=strategy).remote(
                    self.cfg, replace(self.placement, node_rank=rank), str(log_dir / f"{safe_name}-rank{rank}.log")
                )
            )
        return ranks

    def _await_healthy(self) -> None:
        try:
            timeout = self.ready_timeout
            self.backend.wait_ready(self.engine, timeout.seconds)
        except EngineStartTimeout:
            log = Path(self.engine.log_path)
            phase = startup_phase(log.read_text(errors="replace")) if log.is_file() else "launching (no log yet)"
            self.start_error = timeout.error(self.name, phase, str(log))
            logger.error("%s", self.start_error)
            try:  # the driver's wait for the workers ends on this line, not at its own deadline
                ray.get(get_registry().report_start_failure.remote(self.name, self.start_error), timeout=10)
            except ray.exceptions.RayError as exc:
                logger.warning("%s: start-up failure not reported to the registry (%s)", self.name,
                               type(exc).__name__)
            return
        except Exception as exc:  # reported through check_health and endpoint_info
            self.start_error = str(exc)
            logger.error("%s: engine failed to start: %s", self.name, exc)
            return
        ready_s = (self.engine.ready_at or 0) - (self.engine.started_at or 0) or None
        try:
            self.backend.record_ready(self.cfg, self.launch, ready_s, self.cache_state)
        except OSError as exc:  # an unwritable cache dir costs the next start its warm caches, not this run
            logger.warning("%s: compile caches not recorded: %s", self.name, exc)
        self.endpoint = WorkerEndpoint(
            role=self.role,
            name=self.name,
            url=self.launch.url,
            bootstrap_host=self.placement.advertise_host if self.placement.bootstrap_port else None,
            bootstrap_port=self.launch.bootstrap_port or self.placement.bootstrap_port,
            node_id=self.node_id,
            node_ip=self.placement.node_ip,
            gpu_ids=self.placement.gpu_ids,
            log_path=str(self.engine.log_path),
            cache_state=self.cache_state,
        )
        if not self._stopped:
            ray.get(get_registry().register.remote(self.endpoint, self.owner, self.held, self.slot), timeout=60)

    def check_health(self) -> None:
        """Serve's health probe: the engine process lives and answers /health; keep the registry fresh."""
        if self.start_error:
            raise RuntimeError(f"{self.name}: {self.start_error}")
        if not self.engine.alive():
            raise RuntimeError(f"{self.name}: engine process exited; log {self.engine.log_path}")
        for rank, actor in enumerate(self.ranks, start=1):
            if not ray.get(actor.alive.remote(), timeout=10):
                raise RuntimeError(f"{self.name}: engine node rank {rank} exited")
        if self.endpoint is None:
            return  # still starting; _await_healthy enforces the start-up timeout
        try:
            ok = httpx.get(self.launch.url + "/health", timeout=10.0).status_code == 200
        except httpx.HTTPError:
            ok = False
        self._health_failures = 0 if ok else self._health_failures + 1
        if self._health_failures >= HEALTH_FAILURES_TOLERATED:
            raise RuntimeError(f"{self.name}: /health failed {self._health_failures} times in a row")
        if ok:
            try:
                ray.get(get_registry().register.remote(self.endpoint, self.owner, self.held, self.slot), timeout=10)
            except ray.exceptions.RayError as exc:  # a slow or lost registry is not a sick engine: the next check
                # retries, and get_registry() re-creates a lost one (raising here would make Serve restart a
                # healthy engine)
                logger.warning("%s: worker registry did not take the registration (%s); next check retries",
                               self.name, type(exc).__name__)

    def endpoint_info(self) -> dict:
        """Where this replica runs and how its engine is doing (for tests and the run report)."""
        return {
            "name": self.name,
            "role": self.role,
            "node_id": self.node_id,
            "node_ip": self.placement.node_ip,
            "gpu_ids": list(self.placement.gpu_ids),
            "url": self.launch.url,
            "log_path": str(self.engine.log_path),
            "ready": self.endpoint is not None,
            "error": self.start_error,
            "ready_timeout_s": self.ready_timeout.seconds,
            "ready_timeout_source": self.ready_timeout.source,
            "pid": os.getpid(),
        }

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            ray.get(get_registry().unregister.remote(self.name, self.owner), timeout=5)
        except Exception:  # registry already gone with the cluster: nothing to unregister from
            pass
        for actor in self.ranks:
            try:
                ray.get(actor.stop.remote(), timeout=30)
            except Exception:  # rank actor already gone with its node
                pass
        self.engine.stop()

    def __del__(self) -> None:
        self.shutdown()


def engine_worker_deployment(name: str, **options) -> serve.Deployment:
    """The EngineWorker class as a Serve deployment with the given name and placement options."""
    return serve.deployment(EngineWorker, name=name, **options)

