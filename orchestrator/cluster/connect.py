"""Attaching a driver: cluster.address (local | auto | host:port) -> ray.init on loopback-safe terms -> ClusterSession."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator.cluster.inventory import ClusterError
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

    print_to_stdstream.hides_serve_self_kill = True  # type: ignore[attr-defined]  # our mark: installed once
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


class _ServeNoiseFilter(logging.Filter):
    """Drops the driver's Serve INFO lines that say nothing to a user: an object's repr ("Started
    <...SharedRouterLongPollClient object at 0x...>."), "Started Serve in namespace", and the "Connecting to
    existing Serve app ... will not be applied" that serve.run_many logs right after our own serve.start."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Started <") and " object at 0x" in message:
            return False
        return not message.startswith(("Started Serve in namespace", "Connecting to existing Serve app in namespace"))


def init_driver(address: str | None, namespace: str | None = "pd-orchestrator", log_to_driver: bool = False,
                started_here: bool = False) -> None:
    """`ray.init` this process; on a loopback cluster, keep the address and the Serve replicas on loopback.
    `started_here`: this process just started the cluster, so Ray's "Connecting to existing Ray cluster" is noise."""
    import ray

    serve_log = logging.getLogger("ray.serve")
    if not any(isinstance(f, _ServeNoiseFilter) for f in serve_log.filters):
        serve_log.addFilter(_ServeNoiseFilter())

    runtime_env = None
    host = (address or "").removeprefix("ray://").rsplit(":", 1)[0]
    if is_loopback(host):
        keep_loopback_in_this_process()
        runtime_env = {"worker_process_setup_hook": SETUP_HOOK}
    node_ip = None if address and address.startswith("ray://") else own_node_ip()
    ray.init(address=address, namespace=namespace, log_to_driver=log_to_driver, runtime_env=runtime_env,
             logging_level=logging.WARNING if started_here else logging.INFO,
             **({"_node_ip_address": node_ip} if node_ip else {}))


GCS_ANSWER_S = 10.0  # a loaded head still answers one small RPC well within this
_ADDRESS_FIX = ("start the head there (`ray start --head --port=<port> --labels role=prefill`), correct "
                "cluster.address, or set cluster.address: local to start a cluster on this machine")


def require_reachable(address: str, timeout_s: float = 3.0) -> None:
    """ClusterError in one line, before ray.init, when nothing listens at a host:port cluster.address (ray.init
    would retry the GCS for a minute and print every failed RPC)."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # `auto` and other forms Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__.lower().replace("error", "")
        raise ClusterError(f"cluster.address={address}: nothing answers at {host}:{port} ({why}); {_ADDRESS_FIX}") from None
    if not address.startswith("ray://"):  # a Ray Client server is another service; Ray's own error names it
        other = _not_a_gcs(f"{host}:{port}", GCS_ANSWER_S)
        if other is not None:
            raise ClusterError(f"cluster.address={address}: {host}:{port} answers, but not as a Ray head's GCS "
                               f"({other}); {_ADDRESS_FIX}")


def _not_a_gcs(target: str, timeout_s: float) -> str | None:
    """What answered at `target` if it is not a Ray GCS (one gRPC call it serves, silently), else None.

    Something else listening there (another service, a proxy that takes every connection) would make
    ray.init retry for a minute, printing a failed RPC each second."""
    import grpc

    with grpc.insecure_channel(target) as channel:
        get_cluster_id = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")
        try:
            get_cluster_id(b"", timeout=timeout_s)  # an empty GetClusterIdRequest
        except grpc.RpcError as exc:
            code = exc.code()
            if code in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return f"gRPC {code.name}: {exc.details()}"
    return None


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
        require_reachable(address)
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
        init_driver(address, log_to_driver=log_to_driver, started_here=started is not None)
    except ConnectionError as exc:  # e.g. `auto` with no cluster on this machine
        if started is not None:
            started.stop()
        raise ClusterError(f"cluster.address={address}: {str(exc).splitlines()[0]}; {_ADDRESS_FIX}") from None
    except Exception:
        if started is not None:
            started.stop()
        raise
    return ClusterSession(address, started, dashboard_url)
