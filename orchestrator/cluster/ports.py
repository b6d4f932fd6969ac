"""Free TCP ports for servers we start, chosen where the kernel will not hand them to anyone else.

A port from `bind((host, 0))` is in the kernel's ephemeral range, and it is released before the server we
start binds it. In that gap the kernel may give the same number to any outgoing connection or other
`bind(0)`; a Ray cluster opens dozens of both while it starts, and CI once lost the head raylet that way
(its client server could not bind the port we had picked). Ports below the ephemeral range are never
given out by the kernel, so only a process that names the port explicitly can take it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_EPHEMERAL = range(32768, 61000)
RAY_WORKER_PORTS = range(10002, 20000)  # `ray start` default --min-worker-port .. --max-worker-port
LOWEST_PORT = RAY_WORKER_PORTS.stop
MIN_POOL = 1000  # below this many candidates, fall back to the kernel's choice

_random = random.SystemRandom()  # forked workers must not pick the same sequence
_handed_out: set[tuple[str, int]] = set()


def ephemeral_range() -> range:
    try:
        low, high = (int(v) for v in EPHEMERAL_RANGE_FILE.read_text().split())
        return range(low, high + 1)
    except (OSError, ValueError):
        return LINUX_DEFAULT_EPHEMERAL


def candidate_ports() -> range:
    """Ports above Ray's worker range and below the ephemeral range (empty if the two leave no room)."""
    return range(LOWEST_PORT, ephemeral_range().start)


def _socket(host: str) -> socket.socket:
    return socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)


def port_free(host: str, port: int) -> bool:
    with _socket(host) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, outside the ephemeral range, never the same twice in one process."""
    pool = candidate_ports()
    if len(pool) >= MIN_POOL:
        for _ in range(200):
            port = _random.choice(pool)
            if (host, port) not in _handed_out and port_free(host, port):
                _handed_out.add((host, port))
                return port
    with _socket(host) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
