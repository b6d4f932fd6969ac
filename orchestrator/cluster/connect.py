"""Attaching a driver: cluster.address (local | auto | host:port) -> ray.init on loopback-safe terms -> ClusterSession."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator.cluster.local import DEFAULT_STATE_PATH, LocalCluster, LocalClusterState, ray_env
from orchestrator.cluster.ray_loopback import SETUP_HOOK, is_loopback, keep_loopback_in_this_process
from orchestrator.config import RunConfig


@dataclass
class ClusterSession:
    """A connected driver: the address used, and the local cluster if this session started it."""

    address: str
    started: LocalCluster | None = None
    dashboard_url: str | None = None
    owns_driver: bool = True

    def close(self) -> None:
        import ray

        if self.owns_driver and ray.is_initialized():
            ray.shutdown()
        if self.started is not None:
            self.started.stop()


SERVE_SELF_KILL = re.compile(r"Task ServeController\.\w+ failed\..*killed by `ray\.kill`", re.S)


def hide_serve_self_kill_errors() -> None:
    """From now on, drop Ray's "(raylet) Task ServeController.<method> failed ... killed by `ray.kill`" lines
    in this driver. `serve.shutdown()` has the controller kill itself while the driver's graceful_shutdown
    (and the handles' long-poll) calls are pending, so those calls always "fail"; Ray pushes that to the
    driver, whose error listener prints it. Every other line still goes through."""
    import ray._private.worker as worker

    original = worker.print_to_stdstream  # the error listener looks it up in the module at each message
    if getattr(original, "hides_serve_self_kill", False):
        return

    def print_to_stdstream(data, *args, **kwargs):
        lines = [line for line in data.get("lines", []) if not SERVE_SELF_KILL.search(str(line))]
        if lines:
            original({**data, "lines": lines}, *args, **kwargs)

    print_to_stdstream.hides_serve_self_kill = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = print_to_stdstream


def _bindable(ip: str) -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def own_node_ip() -> str | None:
    """The node IP of the raylet on this process's own host, when raylets of other hosts are visible too.

    Ray finds "local" raylets in the machine's process table and, seeing several, attaches a driver to the
    head's. Hosts that share one process table but not one network (network namespaces: tests/multihost,
    containers sharing a PID namespace) then get a driver that talks to another host's raylet through its
    Unix socket and advertises that host's address, where replies to it never arrive. The raylet whose
    (not loopback) address this network stack owns (can bind) is the one. None when that is not in doubt.
    """
    from ray._private.services import _find_address_from_flag

    ips = set(_find_address_from_flag("--node_ip_address"))
    own = [ip for ip in ips if not is_loopback(ip) and _bindable(ip)]  # every namespace has its own 127.0.0.1
    return own[0] if len(ips) > 1 and len(own) == 1 else None


def init_driver(address: str | None, namespace: str = "pd-orchestrator", log_to_driver: bool = False) -> None:
    """`ray.init` this process; on a loopback cluster, keep the address and the Serve replicas on loopback."""
    import ray

    runtime_env = None
    host = (address or "").removeprefix("ray://").rsplit(":", 1)[0]
    if is_loopback(host):
        keep_loopback_in_this_process()
        runtime_env = {"worker_process_setup_hook": SETUP_HOOK}
    node_ip = None if address and address.startswith("ray://") else own_node_ip()
    ray.init(address=address, namespace=namespace, log_to_driver=log_to_driver, runtime_env=runtime_env,
             **({"_node_ip_address": node_ip} if node_ip else {}))


def connect(cfg: RunConfig, state_path: Path | None = None, log_to_driver: bool = False) -> ClusterSession:
    """Attach the driver to the cluster the config names, starting a local one if needed.

    Inside `ray job submit` RAY_ADDRESS is set: a `cluster.address: local` config then attaches to that
    cluster instead of starting a second one.
    """
    import ray

    os.environ.update(ray_env())
    if ray.is_initialized():  # a test or embedding program already attached this process
        return ClusterSession(ray.get_runtime_context().gcs_address, None, None, owns_driver=False)
    state_path = Path(state_path or Path(cfg.benchmark.result_dir) / DEFAULT_STATE_PATH.name)
    started: LocalCluster | None = None
    dashboard_url = None
    if not cfg.cluster.is_local:
        address = cfg.cluster.address
    elif os.environ.get("RAY_ADDRESS") and not os.environ["RAY_ADDRESS"].startswith(("http://", "https://")):
        address = os.environ["RAY_ADDRESS"]  # set by Ray inside `ray job submit` jobs: attach
    else:
        # an http:// RAY_ADDRESS is a dashboard (job API) address, not one a driver can attach to
        state = LocalClusterState.load(state_path)
        if state is None or not state.alive():
            started = LocalCluster(cfg.cluster, state_path)
            state = started.start()
        address, dashboard_url = state.gcs_address, state.dashboard_url
    try:
        init_driver(address, log_to_driver=log_to_driver)
    except Exception:
        if started is not None:
            started.stop()
        raise
    return ClusterSession(address, started, dashboard_url)
