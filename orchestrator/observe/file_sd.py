"""Prometheus file_sd wiring: which /metrics endpoints a run has, kept current in one JSON file.

engines (WorkerRegistry) + our exporters (driver, router replicas) -> ScrapeTargets actor -> file_sd JSON
-> Prometheus (`dashboards/prometheus.yml`, or the user's own on a cluster).

The actor lives on the driver's node, so the file is where `monitor up` (or the user) reads it, and
every target is a node IP:port, so one Prometheus scrapes a multi-node cluster.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlsplit

from orchestrator.records import WorkerEndpoint

log = logging.getLogger(__name__)

SCRAPE_TARGETS_NAME = "pd_scrape_targets"
# Prometheus `job` label of each kind of target; the dashboards select on these.
ENGINE_JOB = "pdorch_engine"
EXPORTER_JOB = "pdorch"


def write_targets(path: str | Path, groups: list[dict]) -> None:
    """Write a file_sd JSON list of {"targets": [...], "labels": {...}} by atomic rename.

    Prometheus re-reads the file on change; a rename means it never sees a half-written file.
    """
    for i, group in enumerate(groups):
        targets = group.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) and ":" in t for t in targets):
            raise ValueError(f"groups[{i}].targets must be a list of 'host:port' strings, got {targets!r}")
        labels = group.get("labels", {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise ValueError(f"groups[{i}].labels must map strings to strings, got {labels!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(groups, f, indent=1)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a Prometheus under another user must read it
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def engine_group(run_id: str, endpoint: WorkerEndpoint) -> dict:
    """The file_sd group for one engine server's /metrics (SGLang's `sglang:` names, or the sim's)."""
    parts = urlsplit(endpoint.url)
    if not parts.hostname or not parts.port:
        raise ValueError(f"worker {endpoint.name}: url {endpoint.url!r} has no host:port to scrape")
    return {
        "targets": [f"{parts.hostname}:{parts.port}"],
        "labels": {"job": ENGINE_JOB, "run_id": run_id, "role": endpoint.role, "worker": endpoint.name},
    }


def exporter_group(run_id: str, address: str, component: str) -> dict:
    """The file_sd group for one of our prometheus_client exporters (component: driver, router-<n>)."""
    return {
        "targets": [address],
        "labels": {"job": EXPORTER_JOB, "run_id": run_id, "component": component},
    }


def scrape_address(bind_host: str, port: int, node_ip: str) -> str:
    """host:port others reach an exporter at: the node IP when it binds every interface."""
    host = node_ip if bind_host in ("0.0.0.0", "::", "") else bind_host
    return f"{host}:{port}"


class TargetFile:
    """A set of named file_sd groups that rewrites its file whenever the set changes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._groups: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._write()

    def set(self, key: str, group: dict) -> None:
        with self._lock:
            if self._closed or self._groups.get(key) == group:
                return
            self._groups[key] = group
            self._write()

    def remove(self, key: str) -> None:
        with self._lock:
            if self._groups.pop(key, None) is not None:
                self._write()

    def replace_prefix(self, prefix: str, groups: dict[str, dict]) -> None:
        """Make the groups whose key starts with `prefix` exactly `groups` (one write)."""
        with self._lock:
            kept = {k: g for k, g in self._groups.items() if not k.startswith(prefix)}
            new = {**kept, **groups}
            if new != self._groups and not self._closed:
                self._groups = new
                self._write()

    def clear(self) -> None:
        """Empty the file for good: later set()/replace_prefix() calls (a poll in flight) write nothing."""
        with self._lock:
            self._closed = True
            self._groups = {}
            self._write()

    def groups(self) -> list[dict]:
        with self._lock:
            return [self._groups[k] for k in sorted(self._groups)]

    def _write(self) -> None:
        write_targets(self.path, [self._groups[k] for k in sorted(self._groups)])


def _scrape_targets_actor_class():
    """The Ray actor class, built on first use so importing this module does not import Ray."""
    import ray

    @ray.remote(num_cpus=0, max_concurrency=4)
    class ScrapeTargets:
        """Owns the run's file_sd file; processes register exporters, engines come from the registry."""

        def __init__(self, path: str, run_id: str, poll_interval_s: float = 1.0):
            self._file = TargetFile(path)
            self._run_id = run_id
            self._stop = threading.Event()
            self._poll_interval_s = poll_interval_s
            threading.Thread(target=self._follow_worker_registry, daemon=True).start()

        def register(self, key: str, group: dict) -> None:
            self._file.set("exporter/" + key, group)

        def unregister(self, key: str) -> None:
            self._file.remove("exporter/" + key)

        def groups(self) -> list[dict]:
            return self._file.groups()

        def path(self) -> str:
            return str(self._file.path)

        def stop(self) -> None:
            """The run is over: stop following the registry and leave an empty list (no dead targets)."""
            self._stop.set()
            self._file.clear()

        def _follow_worker_registry(self) -> None:
            from orchestrator.cluster.registry import get_registry

            version = None
            while not self._stop.is_set():
                try:
                    new_version, endpoints = ray.get(get_registry().snapshot.remote(), timeout=10)
                    if new_version != version:
                        self._file.replace_prefix(
                            "engine/",
                            {"engine/" + e.name: engine_group(self._run_id, e) for e in endpoints},
                        )
                        version = new_version
                except Exception as exc:  # the registry may restart; keep the last good targets
                    log.warning("scrape targets: cannot read the worker registry: %s", exc)
                self._stop.wait(self._poll_interval_s)

    return ScrapeTargets


def start_scrape_targets(path: str | Path, run_id: str, poll_interval_s: float = 1.0):
    """Create (or get) the run's ScrapeTargets actor, pinned to this process's node. Needs ray.init()."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from orchestrator.cluster.registry import NAMESPACE

    node_id = ray.get_runtime_context().get_node_id()
    return (
        _scrape_targets_actor_class()
        .options(
            name=SCRAPE_TARGETS_NAME,
            namespace=NAMESPACE,
            get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        .remote(str(Path(path).resolve()), run_id, poll_interval_s)
    )


def register_exporter(key: str, group: dict) -> None:
    """From any process of the run (e.g. a router replica): list one exporter in the file_sd.

    A no-op with a log line when the run has no ScrapeTargets actor (metrics are then unscraped,
    not an error).
    """
    import ray

    from orchestrator.cluster.registry import NAMESPACE

    try:
        actor = ray.get_actor(SCRAPE_TARGETS_NAME, namespace=NAMESPACE)
    except ValueError:
        log.info("no %s actor: exporter %s is not listed for Prometheus", SCRAPE_TARGETS_NAME, key)
        return
    ray.get(actor.register.remote(key, group))


def serve_metrics(registry, component: str, run_id: str, metrics_cfg, port: int | None = None):
    """Start this process's exporter and list it in the run's file_sd (when Ray and the actor are up).

    One call per process: the bench driver (component "driver", after connecting to Ray) and each router
    replica (component "router-<replica>", port=0 since replicas share nodes). Returns the Exporter.
    `metrics_cfg` is RunConfig.metrics (exporter_host, exporter_port).
    """
    from orchestrator.observe.metrics import start_exporter

    exporter = start_exporter(metrics_cfg.exporter_host, metrics_cfg.exporter_port if port is None else port,
                              registry)
    try:
        import ray

        if ray.is_initialized():
            node_ip = ray.util.get_node_ip_address()
            address = scrape_address(metrics_cfg.exporter_host, exporter.port, node_ip)
            register_exporter(component, exporter_group(run_id, address, component))
    except Exception as exc:  # scraping is optional; the run must not fail for it
        log.warning("exporter %s on %s is not listed for Prometheus: %s", component, exporter.address, exc)
    return exporter
