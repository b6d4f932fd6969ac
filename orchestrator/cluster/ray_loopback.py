"""Keep a one-machine Ray cluster on loopback.

Ray binds its gRPC servers (GCS, raylets, agents) to 127.0.0.1 only when the node IP is a localhost
address, but its CLI and `ray.init` rewrite a localhost address to the machine's outward IP
(`services.resolve_ip_for_localhost`), after which everything listens on all interfaces. Two switches
stop the rewrite:

- `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` makes Ray's "node IP" lookup answer 127.0.0.1. It is read once,
  when `ray._private.ray_constants` is imported, and every Ray process inherits it from its raylet; a
  driver gets it through `keep_loopback_in_this_process()`.
- `ray start` itself rewrites `--node-ip-address` before it starts anything, and with the variable set
  it refuses to start a non-head node ("multi-node clusters are not supported on Windows and OSX").
  `python -m orchestrator.cluster.ray_loopback start ...` runs Ray's own CLI with both decisions made for the
  loopback case; the processes it starts inherit the variable.
"""

from __future__ import annotations

import os
import sys

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1")


def keep_loopback_in_this_process() -> None:
    """Make `ray.init("127.0.0.1:<port>")` in this process connect to 127.0.0.1, not the outward IP."""
    os.environ.update(LOOPBACK_ENV)
    if "ray._private.ray_constants" in sys.modules:  # imported before the variable was set
        setattr(sys.modules["ray._private.ray_constants"], "ENABLE_RAY_CLUSTER", False)  # noqa: B010 (a module)


def bind_serve_replicas_to_node_ip() -> None:
    """Worker start-up hook (runtime_env `worker_process_setup_hook`) for a loopback cluster.

    A Ray Serve 2.60 replica opens its inter-deployment gRPC server on `[::]:0`, whatever the node's
    address; on a loopback node this binds it to the node IP (127.0.0.1) instead. Other gRPC servers
    pass explicit addresses and are left alone.
    """
    import ray
    import ray._common.tls_utils as tls_utils

    node_ip = ray.util.get_node_ip_address()
    if not is_loopback(node_ip) or getattr(tls_utils, "_pdo_loopback", False):
        return
    add_port = tls_utils.add_port_to_grpc_server

    def add_port_on_node_ip(server, address: str):
        host, _, port = address.rpartition(":")
        return add_port(server, f"{node_ip}:{port}" if host in ("[::]", "0.0.0.0", "") else address)

    tls_utils.add_port_to_grpc_server = add_port_on_node_ip
    tls_utils._pdo_loopback = True


SETUP_HOOK = "orchestrator.cluster.ray_loopback.bind_serve_replicas_to_node_ip"  # importable in every worker


def main() -> None:
    os.environ.update(LOOPBACK_ENV)
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services
    from ray.scripts.scripts import main as ray_cli

    ray_constants.ENABLE_RAY_CLUSTER = True  # in this process only: lets a second node join the head
    services.resolve_ip_for_localhost = lambda host: host
    sys.argv[0] = "ray"
    ray_cli()


if __name__ == "__main__":
    main()
