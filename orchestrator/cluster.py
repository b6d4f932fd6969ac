"""Ray cluster access: start/stop a local labelled 2-node cluster, attach to a real one, check node roles.

Node roles are Ray node labels (`cluster.roles.label_key`, default `role=prefill|decode`). A local
cluster is the head raylet (= prefill node) plus a second raylet (= decode node) on this machine, each
advertising `cluster.gpus_per_node` *logical* GPUs so placement groups reserve GPUs exactly as on a real
cluster. We start each raylet with `ray start --block` in its own process group and remember those PIDs
in a state file; stopping kills exactly those process trees (never `ray stop`, which kills every Ray
process on the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.config import ClusterConfig, RunConfig
from orchestrator.ports import free_port
from orchestrator.ray_loopback import LOOPBACK_ENV, SETUP_HOOK, is_loopback, keep_loopback_in_this_process

DEFAULT_STATE_PATH = Path("runs/local-cluster.json")
# defaults for every Ray process and client we start; the caller's environment wins, so a cluster with
# token auth works with RAY_AUTH_MODE=token (docs/running.md §4)
RAY_ENV_DEFAULTS = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
NODE_START_TIMEOUT_S = 180.0


def ray_env() -> dict[str, str]:
    """This process's environment with RAY_ENV_DEFAULTS filled in where unset (or empty)."""
    return {**RAY_ENV_DEFAULTS, **{k: v for k, v in os.environ.items() if v}}


class ClusterError(RuntimeError):
    """The cluster cannot host the layout, or a local cluster failed to start; the message says the fix."""


class NodeExited(ClusterError):
    """A local raylet we started exited during start-up."""

    def __init__(self, message: str, pid: int):
        super().__init__(message)
        self.pid = pid


class EarlierNodeExited(NodeExited):
    """A raylet that was already up exited while the next one started: the cluster is started over."""


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _ray_executable() -> str:
    beside = Path(sys.executable).parent / "ray"
    found = str(beside) if beside.exists() else shutil.which("ray")
    if not found:
        raise ClusterError("the `ray` command is not installed next to this Python; run scripts/dev-setup.sh")
    return found


@dataclass
class LocalNode:
    """One raylet we started: its role label, the PID of its `ray start --block` process, its temp dir."""

    role: str
    pid: int
    temp_dir: str
    metrics_export_port: int
    log_path: str
    gpus: list[str] = field(default_factory=list)  # CUDA_VISIBLE_DEVICES of this raylet; empty: logical GPUs


@dataclass
class LocalClusterState:
    """What `cluster up --local` started; persisted so `cluster down` (or a later run) can find it."""

    gcs_address: str
    dashboard_url: str
    label_key: str
    gpus_per_node: int
    nodes: list[LocalNode] = field(default_factory=list)
    root_dir: str = ""
    started_at: float = 0.0

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> "LocalClusterState | None":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return None
        data["nodes"] = [LocalNode(**n) for n in data.get("nodes", [])]
        return cls(**data)

    def alive(self) -> bool:
        host, port = self.gcs_address.rsplit(":", 1)
        return all(_pid_alive(n.pid) for n in self.nodes) and _port_open(host, int(port))


def machine_gpus() -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES if set, else every GPU the NVIDIA driver lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def gpu_slices(gpus: list[str], per_node: int, roles: list[str]) -> dict[str, list[str]]:
    """Each local node's own GPUs, in node order; {} when the machine has none (logical GPUs only)."""
    if not gpus:
        return {}
    need = per_node * len(roles)
    if len(gpus) < need:
        raise ClusterError(
            f"cluster.gpus_per_node={per_node}: {len(roles)} local nodes need {need} GPUs, this machine has "
            f"{len(gpus)} ({','.join(gpus)}); set cluster.gpus_per_node: {len(gpus) // len(roles) or 1}"
            + ("" if len(gpus) >= len(roles) else " and cluster.local.gpu_split: off (then the nodes share GPUs)")
        )
    return {role: gpus[i * per_node:(i + 1) * per_node] for i, role in enumerate(roles)}


def _pid_alive(pid: int) -> bool:
    """True if `pid` runs; a zombie (exited, not yet reaped by its adopting parent) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(pid: int) -> list[int]:
    """All live descendants of `pid` (from /proc), so processes that left the group are killed too."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_tree(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the `ray start --block` process (it stops its raylet cleanly), then SIGKILL leftovers."""
    tree = [pid, *_descendants(pid)]
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_pid_alive(p) for p in tree):
        _reap(pid)
        time.sleep(0.2)
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


class LocalCluster:
    """A 2-node Ray cluster on this machine: head labelled prefill, second raylet labelled decode."""

    def __init__(self, cluster: ClusterConfig, state_path: Path = DEFAULT_STATE_PATH):
        self.cluster = cluster
        self.state_path = Path(state_path)
        self.state: LocalClusterState | None = None
        self.gpus: dict[str, list[str]] = {}

    def start(self, timeout_s: float = NODE_START_TIMEOUT_S, attempts: int = 3) -> LocalClusterState:
        for attempt in range(attempts):
            try:
                return self._start_once(timeout_s)
            except EarlierNodeExited:
                # say, a port the head opens late was taken in between: start over on fresh ports
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, timeout_s: float) -> LocalClusterState:
        local = self.cluster.local
        roles = self.cluster.roles
        host = local.bind_host
        gcs_port = local.head_port or free_port(host)
        dashboard_port = local.dashboard_port or free_port(host)
        split = local.gpu_split == "auto"
        self.gpus = gpu_slices(machine_gpus(), self.cluster.gpus_per_node, [roles.prefill, roles.decode]) if split else {}
        root = Path(tempfile.mkdtemp(prefix="pdo-ray-", dir="/tmp"))  # short: Ray's socket paths must fit
        state = LocalClusterState(
            gcs_address=f"{host}:{gcs_port}",
            dashboard_url=f"http://{host}:{dashboard_port}",
            label_key=roles.label_key,
            gpus_per_node=self.cluster.gpus_per_node,
            root_dir=str(root),
            started_at=time.time(),
        )
        self.state = state
        try:
            head_args = [
                "--head",
                f"--port={gcs_port}",
                "--include-dashboard=true",
                f"--dashboard-host={host}",
                f"--dashboard-port={dashboard_port}",
                f"--ray-client-server-port={free_port(host)}",
            ]
            # the second raylet gives up at once if the head is not registered in the GCS yet, so wait
            # for the head to be listed as an alive node (through the dashboard), not just the GCS port
            self._start_with_retries(roles.prefill, head_args, root / "head", 1, timeout_s)
            worker_args = [f"--address={state.gcs_address}"]
            self._start_with_retries(roles.decode, worker_args, root / "decode", 2, timeout_s)
        except BaseException:
            self.stop()
            raise
        return state

    def _start_with_retries(self, role: str, args: list[str], temp_dir: Path, alive_after: int,
                            timeout_s: float, attempts: int = 5) -> None:
        """Start one raylet and wait until `alive_after` nodes are alive.

        Ray gives a starting raylet a fixed 30 s to register with the GCS; on a box loaded by other jobs
        that is sometimes not enough and `ray start` exits, so a node that exits is started again.
        """
        assert self.state is not None
        for attempt in range(attempts):
            node_dir = temp_dir.with_name(temp_dir.name + (f"-{attempt}" if attempt else ""))
            self.state.nodes.append(self._start_node(role, args, node_dir))
            self.state.save(self.state_path)
            try:
                self._wait(lambda: self._alive_node_count() >= alive_after, timeout_s, f"node {role} alive")
                return
            except NodeExited as exited:
                if exited.pid != self.state.nodes[-1].pid:
                    raise EarlierNodeExited(str(exited), exited.pid) from None
                node = self.state.nodes.pop()
                _kill_tree(node.pid)
                self.state.save(self.state_path)
                if attempt == attempts - 1:
                    raise

    def _start_node(self, role: str, role_args: list[str], temp_dir: Path) -> LocalNode:
        local = self.cluster.local
        temp_dir.mkdir(parents=True, exist_ok=True)
        metrics_port = free_port(local.bind_host)
        loopback = is_loopback(local.bind_host)
        # on loopback Ray's own CLI would rewrite 127.0.0.1 to the outward IP and listen beyond loopback
        ray_cli = [sys.executable, "-m", "orchestrator.ray_loopback"] if loopback else [_ray_executable()]
        argv = [
            *ray_cli,
            "start",
            "--block",
            *role_args,
            f"--node-ip-address={local.bind_host}",
            f"--num-cpus={local.num_cpus_per_node}",
            f"--num-gpus={self.cluster.gpus_per_node}",
            f"--labels={self.cluster.roles.label_key}={role}",
            f"--object-store-memory={local.object_store_memory_bytes}",
            f"--temp-dir={temp_dir}",
            f"--metrics-export-port={metrics_port}",
            # every port a raylet would otherwise pick for itself comes from ports.free_port's pool
            f"--dashboard-agent-listen-port={free_port(local.bind_host)}",
            f"--dashboard-agent-grpc-port={free_port(local.bind_host)}",
            f"--runtime-env-agent-port={free_port(local.bind_host)}",
            "--disable-usage-stats",
        ]
        gpus = self.gpus.get(role, [])
        gpu_env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else {}
        log_path = temp_dir.parent / f"ray-start-{role}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                argv,
                env={**ray_env(), **(LOOPBACK_ENV if loopback else {}), **gpu_env, "RAY_NUM_REDIS_GET_RETRIES": "120"},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: we kill exactly this tree, never by name
            )
        return LocalNode(role, proc.pid, str(temp_dir), metrics_port, str(log_path), gpus)

    def _alive_node_count(self) -> int:
        from ray.util.state import list_nodes

        assert self.state is not None
        try:
            nodes = list_nodes(address=self.state.dashboard_url, filters=[("state", "=", "ALIVE")])
        except Exception:  # the dashboard answers only once it is up
            return 0
        return len(nodes)

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.state is not None
            dead = [n for n in self.state.nodes if not _pid_alive(n.pid) or _exited(n.pid)]
            if dead:
                node = dead[0]
                raise NodeExited(
                    f"local Ray node role={node.role} exited during start-up; see {node.log_path}:\n"
                    + _tail(node.log_path),
                    node.pid,
                )
            if ready():
                return
            time.sleep(0.5)
        raise ClusterError(f"local Ray cluster: timed out after {timeout_s:.0f}s waiting for {what}")

    def stop(self) -> None:
        """Kill exactly the process trees this cluster started and remove its temp dirs."""
        state = self.state or LocalClusterState.load(self.state_path)
        if state is None:
            return
        for node in reversed(state.nodes):
            _kill_tree(node.pid)
        if state.root_dir and Path(state.root_dir).name.startswith("pdo-ray-"):
            shutil.rmtree(state.root_dir, ignore_errors=True)
        saved = LocalClusterState.load(self.state_path)
        if saved is not None and saved.gcs_address == state.gcs_address:
            self.state_path.unlink(missing_ok=True)
        self.state = None


def _exited(pid: int) -> bool:
    """True if our child `pid` has exited (reaps it; a zombie still answers kill(pid, 0))."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False  # not our child (state loaded from file): _pid_alive decides
    return done == pid


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ---- attaching and checking -------------------------------------------------------------------


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


def init_driver(address: str | None, namespace: str = "pd-orchestrator", log_to_driver: bool = False) -> None:
    """`ray.init` this process; on a loopback cluster, keep the address and the Serve replicas on loopback."""
    import ray

    runtime_env = None
    host = (address or "").removeprefix("ray://").rsplit(":", 1)[0]
    if is_loopback(host):
        keep_loopback_in_this_process()
        runtime_env = {"worker_process_setup_hook": SETUP_HOOK}
    ray.init(address=address, namespace=namespace, log_to_driver=log_to_driver, runtime_env=runtime_env)


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


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    ip: str
    labels: dict[str, str]
    gpus: float
    cpus: float
    gpu_type: str | None = None


def node_inventory() -> list[NodeInfo]:
    """Alive nodes of the connected cluster with labels and resources (for checks and the run report)."""
    import ray

    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        gpu_type = next((k.removeprefix("accelerator_type:") for k in res if k.startswith("accelerator_type:")), None)
        out.append(
            NodeInfo(
                node_id=n["NodeID"],
                ip=n.get("NodeManagerAddress", ""),
                labels={k: v for k, v in (n.get("Labels") or {}).items() if not k.startswith("ray.io/")},
                gpus=float(res.get("GPU", 0)),
                cpus=float(res.get("CPU", 0)),
                gpu_type=gpu_type,
            )
        )
    return out


def check_nodes_fit(cfg: RunConfig, nodes: list[NodeInfo]) -> None:
    """Raise ClusterError before placing anything if a role has no node or too few GPUs."""
    key = cfg.cluster.roles.label_key
    need: dict[str, list[tuple[str, int, int]]] = {}  # role value -> [(group, per-node GPUs, servers)]
    problems = []
    for role, i, group in cfg.layout.groups():
        value = cfg.node_role(role, group)
        per_node = -(-group.gpus_per_server // group.nnodes)
        name = group.name or f"{role}-{i}"
        # rank 0 of every server needs a node of its role; further ranks of a multi-node server any node
        need.setdefault(value, []).append((name, per_node, group.count))
        if group.nnodes > 1 and sum(n.gpus >= per_node for n in nodes) < group.nnodes:
            problems.append(
                f"{name}: one server spans {group.nnodes} nodes with {per_node} GPUs each, but only "
                f"{sum(n.gpus >= per_node for n in nodes)} node(s) have that many; add nodes or lower nnodes"
            )
    for value, groups in need.items():
        labelled = [n for n in nodes if n.labels.get(key) == value]
        if not labelled:
            problems.append(
                f"no node labelled {key}={value}; start one with "
                f"`ray start --address=<head> --labels {key}={value} --num-gpus=<n>`"
            )
            continue
        slots = {n.node_id: int(n.gpus) for n in labelled}
        # first-fit in descending size order: how Ray's STRICT_PACK groups fill nodes, close enough to tell
        for name, per_node, servers in sorted(groups, key=lambda g: -g[1]):
            for _ in range(servers):
                node = next((nid for nid, free in slots.items() if free >= per_node), None)
                if node is None:
                    have = ", ".join(f"{n.ip}:{int(n.gpus)} GPU" for n in labelled)
                    problems.append(
                        f"{name}: needs {servers} x {per_node} GPUs on nodes labelled {key}={value}, "
                        f"but those nodes have {have}; add GPUs/nodes or shrink layout"
                    )
                    break
                slots[node] -= per_node
    if problems:
        raise ClusterError("cluster cannot host the layout:\n  " + "\n  ".join(problems))


# ---- CLI ------------------------------------------------------------------------------------------


def _cluster_cfg(args: argparse.Namespace) -> RunConfig:
    from orchestrator.cli import config_from_args

    if args.config:
        return config_from_args(args)
    from orchestrator.config import load_config

    return load_config(Path(__file__).resolve().parent.parent / "configs" / "default.yaml", args.overrides)


def _cmd_up(args: argparse.Namespace) -> int:
    cfg = _cluster_cfg(args)
    if not args.local and not cfg.cluster.is_local:
        print("cluster up starts local clusters only (--local); a real cluster is started with `ray start`,"
              " see docs/running.md", file=sys.stderr)
        return 2
    existing = LocalClusterState.load(args.state)
    if existing is not None and existing.alive():
        print(f"already running: {existing.gcs_address} (dashboard {existing.dashboard_url})")
        return 0
    state = LocalCluster(cfg.cluster, args.state).start()
    print(f"local Ray cluster up: address {state.gcs_address}, dashboard {state.dashboard_url}")
    for n in state.nodes:
        gpus = f"GPUs {','.join(n.gpus)}" if n.gpus else f"{state.gpus_per_node} logical GPUs"
        print(f"  node {state.label_key}={n.role}: pid {n.pid}, {gpus}, temp dir {n.temp_dir}, "
              f"metrics :{n.metrics_export_port}")
    print(f"export RAY_API_SERVER_ADDRESS={state.dashboard_url} RAY_AUTH_MODE={ray_env()['RAY_AUTH_MODE']}"
          "   # for `ray job submit`")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    state = LocalClusterState.load(args.state)
    if state is None:
        print(f"no local cluster recorded in {args.state}")
        return 0
    cluster = LocalCluster(ClusterConfig(), args.state)
    cluster.state = state
    cluster.stop()
    print(f"stopped local Ray cluster {state.gcs_address} (pids {[n.pid for n in state.nodes]})")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    state = LocalClusterState.load(args.state)
    if state is None:
        print(f"no local cluster recorded in {args.state}")
        return 1
    alive = state.alive()
    print(f"{state.gcs_address}: {'up' if alive else 'DOWN'} (dashboard {state.dashboard_url})")
    for n in state.nodes:
        print(f"  {state.label_key}={n.role}: pid {n.pid} {'alive' if _pid_alive(n.pid) else 'gone'}")
    return 0 if alive else 1


def register(sub: argparse._SubParsersAction) -> None:
    from orchestrator.cli import add_config_args

    p = sub.add_parser("cluster", help="start/stop/inspect the local 2-node Ray cluster")
    csub = p.add_subparsers(dest="cluster_cmd", required=True)
    for name, func, helptext in (
        ("up", _cmd_up, "start a local labelled 2-node Ray cluster (head=prefill, raylet=decode)"),
        ("down", _cmd_down, "stop exactly the processes `cluster up` started"),
        ("status", _cmd_status, "is the recorded local cluster running?"),
    ):
        cp = csub.add_parser(name, help=helptext)
        if name == "up":
            add_config_args(cp, required=False)
            cp.add_argument("--local", action="store_true", help="start it on this machine")
        cp.add_argument("--state", type=Path, default=DEFAULT_STATE_PATH, help="state file (PIDs, addresses)")
        cp.set_defaults(func=func)
