"""Who may connect to an engine server's ports (`engine.allow_from`): an allow-list of IPv4 networks that the kernel
enforces on the listening socket, so a host not on it gets no answer at all (its SYN is dropped, as behind a
firewall) while the gateway's and the peer workers' hosts connect as before.

    engine.allow_from: [cluster]                 # the Ray cluster's node addresses (gateway and workers' hosts)
    engine.allow_from: [cluster, 10.1.0.7/32]    # ... and a monitoring host that scrapes the engines

No root and no iptables/nftables: a classic BPF socket filter (SO_ATTACH_FILTER) on the listening socket, which
every accepted connection inherits. Loopback (127.0.0.0/8) is always allowed: processes of the engine's own host.
The worker resolves `cluster` when it starts its engine and hands the networks over in ALLOW_FROM_ENV.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable

ALLOW_FROM_ENV = "PD_ORCHESTRATOR_ALLOW_FROM"  # comma-separated IPv4 networks, set by the worker for its engine
CLUSTER = "cluster"  # the Ray cluster's node addresses, resolved by the worker
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
MAX_NETWORKS = 80  # a classic BPF jump reaches 255 instructions ahead; 3 per network

SO_ATTACH_FILTER = 26
SKF_NET_OFF = -0x100000  # offsets from here load from the packet's IP header (a TCP socket sees its TCP header)
IPV4_SOURCE_AT = 12
LD_W_ABS, AND_K, JEQ_K, RET_K = 0x20, 0x54, 0x15, 0x06  # BPF_LD|W|ABS, BPF_ALU|AND|K, BPF_JMP|JEQ|K, BPF_RET|K
DROP, ACCEPT = 0, 0xFFFFFFFF


def parse_entry(entry: str) -> ipaddress.IPv4Network | None:
    """One allow-list entry as a network (None for `cluster`); ValueError naming the entry and the fix."""
    if entry == CLUSTER:
        return None
    try:
        return ipaddress.IPv4Network(entry, strict=False)
    except ValueError:
        raise ValueError(f"{entry!r} is not an IPv4 address or network (e.g. 10.1.0.7 or 10.1.0.0/24) nor "
                         f"{CLUSTER!r}") from None


def resolve(entries: Iterable[str], cluster_addresses: Iterable[str]) -> list[ipaddress.IPv4Network]:
    """The networks an allow-list names: `cluster` becomes one /32 per cluster node address; loopback always."""
    networks = [LOOPBACK]
    for entry in entries:
        parsed = parse_entry(entry)
        found = [ipaddress.IPv4Network(a) for a in cluster_addresses] if parsed is None else [parsed]
        networks += [n for n in found if n not in networks]
    if len(networks) > MAX_NETWORKS:
        raise ValueError(f"engine.allow_from names {len(networks)} networks; at most {MAX_NETWORKS}: merge them "
                         "into wider networks")
    return networks


def filter_program(networks: list[ipaddress.IPv4Network]) -> bytes:
    """The BPF program: accept a packet whose IPv4 source lies in one of `networks`, drop every other one."""
    count = len(networks)
    instructions = []
    for i, net in enumerate(networks):
        to_accept = 3 * (count - i) - 2  # from this network's jeq over the rest and the drop
        instructions += [(LD_W_ABS, 0, 0, (SKF_NET_OFF + IPV4_SOURCE_AT) & 0xFFFFFFFF),
                         (AND_K, 0, 0, int(net.netmask)),
                         (JEQ_K, to_accept, 0, int(net.network_address))]
    instructions += [(RET_K, 0, 0, DROP), (RET_K, 0, 0, ACCEPT)]
    return b"".join(struct.pack("HBBI", *ins) for ins in instructions)


def restrict_sources(sock: socket.socket, networks: list[ipaddress.IPv4Network]) -> None:
    """Attach the allow-list to `sock` (an IPv4 TCP socket, before it listens)."""
    if sock.family != socket.AF_INET:
        raise ValueError("engine.allow_from applies to IPv4 listeners only; bind the engine to an IPv4 address")
    program = filter_program(networks)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(buffer))  # struct sock_fprog {len; *filter}
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def networks_from_env() -> list[ipaddress.IPv4Network] | None:
    """The allow-list the worker handed to this engine process, or None when it may be reached from anywhere."""
    text = os.environ.get(ALLOW_FROM_ENV, "").strip()
    if not text:
        return None
    return resolve([e.strip() for e in text.split(",") if e.strip()], [])


def listening_socket(host: str, port: int, networks: list[ipaddress.IPv4Network]) -> socket.socket:
    """A TCP socket bound to (host, port) that only hosts in `networks` can connect to (not listening yet)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        restrict_sources(sock, networks)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


async def start_site(runner, host: str, port: int, backlog: int) -> None:
    """Serve aiohttp `runner` on (host, port): to every host, or only to those in ALLOW_FROM_ENV when it is set."""
    from aiohttp import web

    allowed = networks_from_env()
    if allowed is None:
        site: web.BaseSite = web.TCPSite(runner, host, port, reuse_address=True, backlog=backlog)
    else:
        site = web.SockSite(runner, listening_socket(host, port, allowed), backlog=backlog)
    await site.start()
