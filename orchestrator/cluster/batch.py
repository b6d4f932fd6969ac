"""What a batch job script (orchestrator.cluster.jobscript) asks on its nodes at job time.

    python -m orchestrator.cluster.batch fabric-ip --iface auto|ib0|...
    python -m orchestrator.cluster.batch wait-nodes --dashboard URL --label-key role --roles prefill decode
    python -m orchestrator.cluster.batch job-status --dashboard URL --id SUBMISSION_ID
    python -m orchestrator.cluster.batch job-stop --dashboard URL --id SUBMISSION_ID

Every answer is one line on stdout (errors one line on stderr); the exit code is what the script acts on.
Token auth: the Ray token comes from RAY_AUTH_TOKEN in the environment, never from an argument.
"""

from __future__ import annotations

import argparse
import fcntl
import ipaddress
import os
import socket
import struct
import sys
import time
from pathlib import Path

from orchestrator.process import pid_alive

ROUTE_TABLE = Path("/proc/net/route")
SIOCGIFADDR = 0x8915


class FabricError(RuntimeError):
    """No usable IPv4 address on the interface asked for; the message says which ones exist."""


def interface_ips() -> dict[str, list[str]]:
    """The IPv4 address of each interface that has one (loopback and link-local left out)."""
    out: dict[str, list[str]] = {}
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:  # no IPv4 address on it
                continue
        ip = ipaddress.ip_address(socket.inet_ntoa(packed[20:24]))
        if not (ip.is_loopback or ip.is_link_local):
            out.setdefault(name, []).append(str(ip))
    return out


def default_route_iface(route_table: Path = ROUTE_TABLE) -> str | None:
    try:
        rows = route_table.read_text().splitlines()[1:]
    except OSError:
        return None
    for row in rows:
        cols = row.split()
        if len(cols) > 2 and cols[1] == "00000000":
            return cols[0]
    return None


def fabric_ip(iface: str, ips: dict[str, list[str]] | None = None, route_iface: str | None = None) -> str:
    """The node IP to start Ray with: the first IPv4 address of `iface`; for `auto` an InfiniBand interface
    (ib*, sorted) if there is one, else the default route's interface, else the only interface there is."""
    ips = interface_ips() if ips is None else ips
    have = ", ".join(f"{n} {' '.join(a)}" for n, a in sorted(ips.items())) or "none"
    if iface != "auto":
        if not ips.get(iface):
            raise FabricError(f"interface {iface} has no IPv4 address here (have: {have}); pass --iface/PDO_IFACE")
        return ips[iface][0]
    infiniband = sorted(n for n in ips if n.startswith("ib"))
    if infiniband:
        return ips[infiniband[0]][0]
    route_iface = route_iface if route_iface is not None else default_route_iface()
    if route_iface and ips.get(route_iface):
        return ips[route_iface][0]
    if len(ips) == 1:
        return next(iter(ips.values()))[0]
    raise FabricError(f"--iface auto: no ib* interface, no default route, and several interfaces ({have}); "
                      "name the fabric one with --iface/PDO_IFACE")


def alive_nodes(dashboard: str, token: str | None, timeout_s: float = 10.0) -> list[dict]:
    """ALIVE nodes per the dashboard's state API (node_ip, labels); [] while it does not answer."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(f"{dashboard}/api/v0/nodes", params={"limit": 100, "detail": "true"}, headers=headers,
                      timeout=timeout_s)
        rows = r.json()["data"]["result"]["result"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return []
    return [row for row in rows if row.get("state") == "ALIVE"]


def wait_nodes(dashboard: str, label_key: str, roles: list[str], timeout_s: float, watch: list[int]) -> str:
    """Wait until an alive node carries each of `roles`; fail at once if a watched launcher exits."""
    token = os.environ.get("RAY_AUTH_TOKEN")
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = alive_nodes(dashboard, token)
        by_role = {n.get("labels", {}).get(label_key): n.get("node_ip") for n in nodes}
        if all(r in by_role for r in roles):
            return ", ".join(f"{by_role[r]} {label_key}={r}" for r in roles)
        gone = [p for p in watch if not pid_alive(p)]
        if gone:
            raise TimeoutError(f"a node launcher (pid {gone[0]}) exited before {label_key}={roles} were alive; "
                               "see the run directory's logs/ray-*.log")
        if time.monotonic() > deadline:
            seen = ", ".join(f"{n.get('node_ip')} {n.get('labels', {}).get(label_key)}" for n in nodes) or "none"
            raise TimeoutError(f"after {timeout_s:.0f}s the alive nodes are: {seen}; wanted {label_key}={roles}")
        time.sleep(1.0)


def job_status(dashboard: str, submission_id: str) -> tuple[int, str]:
    """(exit code, line): the job's driver exit code (0 only for SUCCEEDED with exit 0), and its status line."""
    from ray.job_submission import JobSubmissionClient

    info = JobSubmissionClient(dashboard).get_job_info(submission_id)
    code = info.driver_exit_code
    status = str(getattr(info.status, "value", info.status))
    rc = 0 if status == "SUCCEEDED" else (code or 1)  # a job stopped or lost has no driver exit code
    line = f"job {submission_id}: {status}, driver exit code {code}" + (f" ({info.message})" if info.message else "")
    return rc, line


def stop_job(dashboard: str, submission_id: str, timeout_s: float = 10.0) -> str:
    """Ask Ray's job API to stop a job (Ray SIGTERMs its driver), one HTTP call: a scancel/qdel clean-up has seconds,
    and the `ray job stop` CLI took ~4 of them to start on a loaded node."""
    import httpx

    token = os.environ.get("RAY_AUTH_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.post(f"{dashboard}/api/jobs/{submission_id}/stop", headers=headers, timeout=timeout_s)
    r.raise_for_status()
    return f"job {submission_id}: stop requested (stopped: {r.json().get('stopped')})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.cluster.batch", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    ip = sub.add_parser("fabric-ip", help="this node's IPv4 address on the fabric interface")
    ip.add_argument("--iface", default="auto")
    wait = sub.add_parser("wait-nodes", help="until an alive Ray node carries each role label")
    wait.add_argument("--dashboard", required=True)
    wait.add_argument("--label-key", default="role")
    wait.add_argument("--roles", nargs="+", required=True)
    wait.add_argument("--timeout", type=float, default=300.0)
    wait.add_argument("--watch-pid", type=int, nargs="*", default=[])
    status = sub.add_parser("job-status", help="a Ray job's status; exit code = its driver's exit code")
    status.add_argument("--dashboard", required=True)
    status.add_argument("--id", required=True)
    stop = sub.add_parser("job-stop", help="ask Ray to stop a job (SIGTERM to its driver)")
    stop.add_argument("--dashboard", required=True)
    stop.add_argument("--id", required=True)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "fabric-ip":
            print(fabric_ip(args.iface))
            return 0
        if args.cmd == "wait-nodes":
            print(f"alive: {wait_nodes(args.dashboard, args.label_key, args.roles, args.timeout, args.watch_pid)}")
            return 0
        if args.cmd == "job-stop":
            import httpx

            try:
                print(stop_job(args.dashboard, args.id))
            except httpx.HTTPError as exc:
                raise TimeoutError(f"job {args.id}: the job API did not take the stop ({exc})") from None
            return 0
        rc, line = job_status(args.dashboard, args.id)
        print(line)
        return rc
    except (FabricError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
