"""Security: every service of ours listens on loopback unless configured, the ingress API key is enforced,
and secrets never reach the run manifest or the logs.

Listening sockets are read from /proc (the kernel's own table, mapped to processes by socket inode), so
the checks see exactly what a port scan from another machine would find, for exactly the processes we
started: the local cluster's `ray start` trees and the engine processes under them.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.cluster import LocalClusterState


@dataclass(frozen=True)
class ListeningSocket:
    """One TCP socket in LISTEN state and the process holding it."""

    pid: int
    process: str
    host: str
    port: int

    @property
    def loopback_only(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback

    def __str__(self) -> str:
        return f"{self.process}[{self.pid}] listens on {self.host}:{self.port}"


def process_tree(pid: int) -> list[int]:
    """`pid` and all its live descendants, from /proc (engines leave their parent's process group)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    tree, todo = [pid], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            tree.append(child)
            todo.append(child)
    return tree


def pid_alive(pid: int) -> bool:
    """True if `pid` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _decode_address(field: str, ipv6: bool) -> tuple[str, int]:
    hex_ip, hex_port = field.split(":")
    raw = bytes.fromhex(hex_ip)
    if ipv6:  # four little-endian 32-bit words
        host = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
        host = host.removeprefix("::ffff:") if "." in host else host  # IPv4-mapped
    else:
        host = socket.inet_ntop(socket.AF_INET, raw[::-1])
    return host, int(hex_port, 16)


def listening_sockets(pids: list[int]) -> list[ListeningSocket]:
    """TCP sockets in LISTEN state held by any of `pids` (IPv4 and IPv6)."""
    owner: dict[str, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owner[target[8:-1]] = pid
    found = []
    for table, ipv6 in (("tcp", False), ("tcp6", True)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in owner:  # 0A = TCP_LISTEN
                continue
            pid = owner[fields[9]]
            host, port = _decode_address(fields[1], ipv6)
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                name = "?"
            found.append(ListeningSocket(pid, name, host, port))
    return found


def pid_listening_on(port: int, candidates: list[int]) -> int | None:
    """Which of `candidates` listens on TCP `port` (e.g. the engine process behind a worker URL)."""
    return next((s.pid for s in listening_sockets(candidates) if s.port == port), None)


def cluster_pids(state: LocalClusterState) -> list[int]:
    """Every live process under the local cluster's `ray start` processes (raylets, workers, engines)."""
    pids: list[int] = []
    for node in state.nodes:
        pids.extend(process_tree(node.pid))
    return pids


# ---- the local embedded cluster -------------------------------------------------------------------------


@pytest.mark.ray
def test_local_cluster_listens_only_on_loopback(ray_cluster: LocalClusterState) -> None:
    sockets = listening_sockets(cluster_pids(ray_cluster))
    assert sockets, "found no listening sockets under the local cluster's processes; is /proc readable?"
    exposed = [str(s) for s in sockets if not s.loopback_only]
    print(f"local cluster: {len(sockets)} listening sockets, {len(exposed)} not on loopback")
    assert not exposed, (
        "the local embedded cluster must bind loopback only (cluster.local.bind_host=127.0.0.1), but:\n  "
        + "\n  ".join(exposed)
    )
