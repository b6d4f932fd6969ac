"""One deployment's life: place -> start -> ready -> teardown, as a context manager bench, sweep and mlperf share.

`Deployment(cfg, run_id, deadline_at)`: `place()` connects to (or starts) the cluster, checks the nodes fit,
deploys the worker apps and the router; `wait_ready()` returns the ready worker endpoints; leaving the
`with` block (or `close()`) shuts Serve down, then the driver, then the local cluster if this run started it.
`serve_deployment(cfg)` does all of it and yields the router's HTTP URL.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from orchestrator.cluster.ports import free_port, port_free
from orchestrator.config import RunConfig
from orchestrator.run.driver import arm_signals, check_stop

if TYPE_CHECKING:
    from orchestrator.cluster.connect import ClusterSession

RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray for the entrypoint of `ray job submit`
JOB_RESULT_ROOT = "~/pd-orchestrator"


def job_path(path: str | Path) -> Path:
    """Where a configured path (benchmark.result_dir, metrics.file_sd_path) is. A relative one is relative to
    the working directory, except inside a Ray job, whose working directory is a temporary copy that
    disappears with the cluster: there it is relative to $PD_ORCHESTRATOR_RESULT_ROOT (which `cluster up
    --local` gives its raylets: the directory it ran in), else to ~/pd-orchestrator on the node that runs the job."""
    from orchestrator.cluster.local import RESULT_ROOT_ENV

    path = Path(path).expanduser()
    if path.is_absolute() or not os.environ.get(RAY_JOB_ENV):
        return path
    return (Path(os.environ.get(RESULT_ROOT_ENV) or JOB_RESULT_ROOT).expanduser() / path).resolve()


def with_free_router_port(cfg: RunConfig) -> RunConfig:
    """On a local cluster a busy router port (another run on this box) moves to a free one."""
    if cfg.cluster.is_local and not os.environ.get("RAY_ADDRESS") and not port_free(cfg.router.host, cfg.router.port):
        port = free_port(cfg.router.host)
        print(f"router.port {cfg.router.port} is busy on {cfg.router.host}; using {port}", file=sys.stderr)
        cfg = cfg.model_copy(update={"router": cfg.router.model_copy(update={"port": port})})
    return cfg


@dataclass(frozen=True)
class PlacementStep:
    """One step of `Deployment.place`, in wall-clock seconds (time.time()): where placement's time goes."""

    name: str
    start: float
    end: float


class Deployment:
    """Workers + router of one run on a Ray cluster; a context manager that always tears down."""

    def __init__(self, cfg: RunConfig, run_id: str, deadline_at: float, state_path: Path | None = None,
                 per_replica: bool = False):
        self.cfg = cfg
        self.per_replica = per_replica  # one Serve application per worker replica (`serve`: live layout changes)
        self.run_id = run_id
        self.deadline_at = deadline_at  # time.time() by which the deployment must be ready
        self.state_path = state_path
        self.session: ClusterSession | None = None  # the cluster connection (and the local cluster, if we started it)
        self.nodes: list = []
        self.scrape_targets: Any = None  # the ScrapeTargets actor writing metrics.file_sd_path (this handle keeps it alive)
        self.steps: list[PlacementStep] = []  # what place() spent, step by step
        self._placing_since = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.cfg.router.host}:{self.cfg.router.port}"

    def _time_left_s(self) -> float:
        return max(1.0, self.deadline_at - time.time())

    def place(self) -> list:
        """Connect, check the nodes fit, deploy workers and router; returns the cluster's nodes."""
        self.steps, self._placing_since = [], time.time()
        import ray

        from deployments.app import deploy
        from orchestrator.cluster.connect import connect
        from orchestrator.cluster.inventory import check_nodes_fit, node_inventory
        from orchestrator.cluster.registry import get_registry

        self._step_done("imports")
        self.session = connect(self.cfg, self.state_path)
        if self.session.started is not None:  # this run started the local cluster: its raylets one after the other
            for role, alive_at in self.session.started.alive_at.items():
                self._step_done(f"{role} raylet", alive_at)
        self._step_done("driver attach")
        arm_signals()  # ray.init installed its own SIGTERM handler
        try:
            self.nodes = node_inventory()
            check_nodes_fit(self.cfg, self.nodes)
            ray.get(get_registry().clear.remote())  # endpoints of an earlier run on this cluster are stale
            self._step_done("nodes + registry")
            self._list_targets()  # before the router deploys: its replicas list their exporters there
            self._step_done("scrape targets")
            deploy(self.cfg, self.run_id, timeout_s=self._time_left_s(), per_replica=self.per_replica,
                   on_step=self._step_done)
        except BaseException:
            self.close()
            raise
        return self.nodes

    def _step_done(self, name: str, at: float | None = None) -> None:
        """Record placement step `name` as ending `at` (now), from where the previous one ended."""
        start = self.steps[-1].end if self.steps else self._placing_since
        self.steps.append(PlacementStep(name, start, time.time() if at is None else at))

    def _list_targets(self) -> None:
        """Start the run's ScrapeTargets actor: metrics.file_sd_path lists the engines and our exporters while
        the deployment is up (Prometheus, e.g. `monitor up`, follows it). An aid: a failure is logged."""
        import ray

        from orchestrator.observe.file_sd import start_scrape_targets

        try:
            self.scrape_targets = start_scrape_targets(job_path(self.cfg.metrics.file_sd_path), self.run_id)
            ray.get(self.scrape_targets.path.remote(), timeout=60)
        except Exception as exc:
            print(f"metrics: scrape targets not written to {self.cfg.metrics.file_sd_path}: {exc}", file=sys.stderr)
            self.scrape_targets = None

    def _unlist_targets(self) -> None:
        """Empty the targets file (the run's processes are going away) and stop the actor."""
        if self.scrape_targets is None:
            return
        import ray

        try:
            ray.get(self.scrape_targets.stop.remote(), timeout=10)
            ray.kill(self.scrape_targets)
        except Exception as exc:
            print(f"teardown: scrape targets not cleared: {exc}", file=sys.stderr)
        self.scrape_targets = None

    def router(self):
        """The router's Serve handle (the bench driver streams its batch through it)."""
        from ray import serve

        from deployments.app import ROUTER_APP

        return serve.get_app_handle(ROUTER_APP)

    def wait_ready(self) -> list:
        """The worker endpoints, once every expected worker is registered and healthy."""
        from deployments.app import expected_workers

        from orchestrator.cluster.registry import WorkersFailedToStart

        response = self.router().wait_ready.remote(expected_workers(self.cfg), self._time_left_s())
        while True:  # short waits, so Ctrl-C / SIGTERM handlers get to run promptly
            try:
                return response.result(timeout_s=1.0)
            except TimeoutError:
                check_stop()
            except WorkersFailedToStart as exc:  # Ray's wrapper carries the router's traceback: keep the one line
                raise WorkersFailedToStart(str(getattr(exc, "cause", None) or exc)) from None

    def close(self) -> None:
        """Serve down, then the driver, then the local cluster if this run started it; never raises."""
        try:
            import ray
            from ray import serve

            if ray.is_initialized():
                from orchestrator.cluster.connect import hide_serve_self_kill_errors

                self._unlist_targets()
                hide_serve_self_kill_errors()  # Serve's controller kills itself; Ray calls that a failure
                serve.shutdown()
        except Exception as exc:
            print(f"teardown: serve.shutdown failed: {exc}", file=sys.stderr)
        if self.session is not None:
            try:
                self.session.close()
            except Exception as exc:
                print(f"teardown: cluster stop failed: {exc}", file=sys.stderr)
            self.session = None

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def serve_deployment(cfg: RunConfig, state_path: Path | None = None, timeout_s: float | None = None) -> Iterator[str]:
    """Bring the deployment up as `bench` does and yield the router's HTTP URL; tear it down after."""
    cfg = with_free_router_port(cfg)
    deadline_at = time.time() + (timeout_s or cfg.benchmark.deadline_s)
    with Deployment(cfg, f"{cfg.name}-serve-{uuid.uuid4().hex[:6]}", deadline_at, state_path) as deployment:
        deployment.place()
        deployment.wait_ready()
        yield deployment.url


@contextlib.contextmanager
def deployment_url(cfg: RunConfig, url: str | None) -> Iterator[str]:
    """The router to load: --url as given, else the deployment from the config brought up like `bench` does."""
    if url:
        yield url.rstrip("/")
        return
    with serve_deployment(cfg) as router_url:
        yield router_url.rstrip("/")
