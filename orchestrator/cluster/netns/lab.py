"""Separate hosts on one machine: Linux network namespaces node-a, node-b and a client on one switch.

    node-a (eth0 198.18.0.1) --veth-- [switch: bridge br0] --veth-- node-b (eth0 198.18.0.2)
                                            |
                                          veth
                                            |
                                   client (eth0 198.18.0.3)

Every namespace of one lab is named `pdo-<tag>-<role>` (tag: 6 random hex digits), so parallel runs never
collide and `leftovers.cleanup_leftovers()` finds what a killed run left. The addresses exist only inside the
lab's namespaces; no namespace has a route out. "The link" of a host is its switch port: `link_down`
pulls the cable (the host keeps its address, packets are lost until `link_up`), `shape` puts a `tbf`
rate limit on both directions (this kernel has no netem/fq). Processes are started with
`ip netns exec`; `destroy()` kills every process in the lab's namespaces (only ours can be in them),
then deletes the namespaces, which deletes their veths and the bridge with them.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

PREFIX = "pdo-"
NETNS_DIR = Path("/run/netns")
OWNER_DIR = Path("/run/pdo-netns")  # <tag>: PID of the process that owns the lab
SUBNET = "198.18.0"  # RFC 2544 benchmarking range: never routed anywhere
IFACE = "eth0"
ROLES = ("node-a", "node-b", "client")
CLONE_NEWNET = 0x40000000


class NetnsError(RuntimeError):
    """An `ip`/`tc` command failed; the message has the command and its stderr."""


def run_ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def unavailable_reason() -> str | None:
    """Why namespaces cannot be created here (one line), or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run as root to test across hosts"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed; apt-get install iproute2"
    if shutil.which("tc") is None:
        return "the `tc` command (iproute2) is not installed; apt-get install iproute2"
    probe = f"{PREFIX}probe-{os.getpid()}"
    made = run_ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    run_ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    """One namespace of a lab: its role, namespace name, address, and its port on the switch."""

    role: str
    netns: str
    ip: str
    switch_port: str
    iface: str = IFACE


def netns_pids(netns: str) -> list[int]:
    """Every process whose network namespace is `netns` (`ip netns pids`)."""
    done = run_ip("netns", "pids", netns, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def kill_all(netns: str, grace_s: float) -> list[int]:
    """SIGTERM every process in `netns`, SIGKILL what is left after `grace_s`; returns the PIDs seen."""
    seen: set[int] = set()
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        pids = netns_pids(netns)
        seen.update(pids)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while netns_pids(netns) and time.monotonic() < deadline:
            time.sleep(0.1)  # an exited process leaves the list at once (a zombie has no namespace)
        if not netns_pids(netns):
            break
    return sorted(seen)


def _in_netns(netns: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run fn in a fresh thread that entered `netns` (sockets it opens live in that namespace)."""
    out: dict[str, Any] = {}

    def body() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(NETNS_DIR / netns, os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                out["error"] = NetnsError(f"setns({netns}) failed: {os.strerror(ctypes.get_errno())}")
                return
        finally:
            os.close(fd)
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=body, name=f"in-{netns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


LIVE_LABS: dict[str, "NetnsLab"] = {}


@atexit.register
def _destroy_live_labs() -> None:
    for lab in list(LIVE_LABS.values()):
        lab.destroy()


class NetnsLab:
    """node-a, node-b and client namespaces on one bridge; a context manager that always cleans up."""

    def __init__(self, roles: tuple[str, ...] = ROLES, tag: str | None = None):
        self.tag = tag or secrets.token_hex(3)
        self.switch = f"{PREFIX}{self.tag}-switch"
        self.hosts = {
            role: Host(role, f"{PREFIX}{self.tag}-{role}", f"{SUBNET}.{i}", f"port{i}")
            for i, role in enumerate(roles, start=1)
        }
        self.created: list[str] = []
        self.started: list[subprocess.Popen] = []

    # ---- life cycle ---------------------------------------------------------------------------------
    def create(self) -> "NetnsLab":
        OWNER_DIR.mkdir(parents=True, exist_ok=True)
        (OWNER_DIR / self.tag).write_text(str(os.getpid()))
        LIVE_LABS[self.tag] = self
        try:
            self._add_netns(self.switch)
            run_ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            run_ip("-n", self.switch, "link", "set", "dev", "br0", "up")
            for host in self.hosts.values():
                self._add_netns(host.netns)
                run_ip("link", "add", host.iface, "netns", host.netns, "type", "veth",
                    "peer", "name", host.switch_port, "netns", self.switch)
                run_ip("-n", self.switch, "link", "set", "dev", host.switch_port, "master", "br0")
                run_ip("-n", self.switch, "link", "set", "dev", host.switch_port, "up")
                run_ip("-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", host.iface)
                run_ip("-n", host.netns, "link", "set", "dev", host.iface, "up")
                run_ip("-n", host.netns, "link", "set", "dev", "lo", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_netns(self, name: str) -> None:
        run_ip("netns", "add", name)
        self.created.append(name)

    def destroy(self, grace_s: float = 5.0) -> dict[str, list[int]]:
        """Kill every process in the lab's namespaces, delete them; returns the PIDs killed per namespace."""
        killed: dict[str, list[int]] = {}
        for name in reversed(self.created):
            if (NETNS_DIR / name).exists():
                killed[name] = kill_all(name, grace_s)
                run_ip("netns", "del", name, check=False)
        for proc in self.started:
            if proc.poll() is None:  # `ip netns exec` itself is in the root namespace only for an instant
                proc.kill()
            proc.wait()
        self.created.clear()
        self.started.clear()
        LIVE_LABS.pop(self.tag, None)
        (OWNER_DIR / self.tag).unlink(missing_ok=True)
        return killed

    def __enter__(self) -> "NetnsLab":
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def namespaces(self) -> list[str]:
        """The lab's namespaces that exist now."""
        return [n for n in (self.switch, *(h.netns for h in self.hosts.values())) if (NETNS_DIR / n).exists()]

    # ---- processes ----------------------------------------------------------------------------------
    def prefix(self, role: str) -> list[str]:
        """The command prefix that runs a program on host `role`."""
        return ["ip", "netns", "exec", self.hosts[role].netns]

    def popen(self, role: str, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """Start `argv` on host `role` in its own session; `destroy()` stops it with the namespace."""
        kwargs.setdefault("start_new_session", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen([*self.prefix(role), *argv], **kwargs)
        self.started.append(proc)
        return proc

    def run(self, role: str, argv: list[str], timeout_s: float = 120, **kwargs: Any) -> subprocess.CompletedProcess:
        """Run `argv` on host `role` to completion (output captured as text)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run([*self.prefix(role), *argv], timeout=timeout_s, stdin=subprocess.DEVNULL, **kwargs)

    def call(self, role: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args) with its sockets on host `role` (a thread that entered the namespace)."""
        return _in_netns(self.hosts[role].netns, fn, *args, **kwargs)

    def pids(self, role: str | None = None) -> list[int]:
        """Processes in host `role`'s namespace, or in all the lab's namespaces."""
        names = [self.hosts[role].netns] if role else self.namespaces()
        return sorted(p for n in names for p in netns_pids(n))

    def kill(self, role: str, grace_s: float = 5.0) -> list[int]:
        """Stop every process on host `role` (the namespace itself stays)."""
        return kill_all(self.hosts[role].netns, grace_s)

    # ---- the link -----------------------------------------------------------------------------------
    def link_down(self, role: str) -> None:
        """Pull host `role`'s cable: its switch port goes down, the host keeps its address."""
        run_ip("-n", self.switch, "link", "set", "dev", self.hosts[role].switch_port, "down")

    def link_up(self, role: str) -> None:
        run_ip("-n", self.switch, "link", "set", "dev", self.hosts[role].switch_port, "up")

    def shape(self, role: str, rate_mbit: float) -> None:
        """Limit host `role`'s link to `rate_mbit` Mbit/s each way (tbf on both ends of its veth)."""
        rate_bytes_s = rate_mbit * 1e6 / 8
        burst = max(16 * 1024, int(rate_bytes_s / 100))  # >= one 10 ms timer tick of data at the rate
        host = self.hosts[role]
        for netns, dev in ((host.netns, host.iface), (self.switch, host.switch_port)):
            _run_tc("-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                    f"{rate_mbit * 1000:.0f}kbit", "burst", str(burst), "latency", "400ms")

    def unshape(self, role: str) -> None:
        host = self.hosts[role]
        for netns, dev in ((host.netns, host.iface), (self.switch, host.switch_port)):
            subprocess.run(["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"], capture_output=True, timeout=30)

    def shaped_rate_mbit(self, role: str) -> float | None:
        """The tbf rate on host `role`'s own end of the link, as `tc` reports it (None: not shaped)."""
        host = self.hosts[role]
        out = subprocess.run(["tc", "-n", host.netns, "qdisc", "show", "dev", host.iface],
                             capture_output=True, text=True, timeout=30).stdout.split()
        if "tbf" not in out or "rate" not in out:
            return None
        return _parse_rate_mbit(out[out.index("rate") + 1])


def _run_tc(*args: str) -> None:
    done = subprocess.run(["tc", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetnsError(f"`tc {' '.join(args)}` failed: {done.stderr.strip()}")


def _parse_rate_mbit(text: str) -> float:
    """'100Mbit' / '64Kbit' / '1Gbit' / '800bit' (tc's output) -> Mbit/s."""
    units = {"gbit": 1e3, "mbit": 1.0, "kbit": 1e-3, "bit": 1e-6}
    low = text.lower()
    for unit, scale in units.items():
        if low.endswith(unit):
            return float(low[: -len(unit)]) * scale
    raise ValueError(f"unknown tc rate {text!r}")
