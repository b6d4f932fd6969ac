"""Which processes listen on which TCP addresses, read from the kernel (/proc/net/tcp{,6} mapped to processes
by socket inode): what a port scan from another machine would find, per process.

    pd-orchestrator cluster sockets                      # every listening socket of this machine, exposed first
    python -m orchestrator.cluster.listening            # the same, importing nothing else (device scripts)
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path


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


def all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def main() -> int:
    sockets = sorted(set(listening_sockets(all_pids())), key=lambda s: (s.loopback_only, s.process, s.port))
    for s in sockets:
        print(f"{'loopback' if s.loopback_only else 'EXPOSED '} {s}")
    print(f"{len(sockets)} listening sockets, {sum(not s.loopback_only for s in sockets)} not on loopback",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
