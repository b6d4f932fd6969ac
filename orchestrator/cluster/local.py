"""Ray cluster access: start/stop a local labelled 2-node cluster, attach to a real one, check node roles.

Node roles are Ray node labels (`cluster.roles.label_key`, default `role=prefill|decode`). A local
cluster is the head raylet (= prefill node) plus a second raylet (= decode node) on this machine, each
advertising `cluster.gpus_per_node` *logical* GPUs so placement groups reserve GPUs exactly as on a real
cluster. We start each raylet with `ray start --block` in its own process group and remember those PIDs
in a state file; stopping kills exactly those process trees (never `ray stop`, which kills every Ray
process on the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.cluster.inventory import ClusterError, gpu_slices, machine_gpus
from orchestrator.cluster.ports import free_port
from orchestrator.cluster.ray_loopback import LOOPBACK_ENV, is_loopback
from orchestrator.config import ClusterConfig
from orchestrator.process import ManagedProcess, descendants, pid_alive, reap, tail

DEFAULT_STATE_PATH = Path("runs/local-cluster.json")
# defaults for every Ray process and client we start; the caller's environment wins, so a cluster with
# token auth works with RAY_AUTH_MODE=token (docs/running.md §4)
# RAY_JOB_STOP_WAIT_TIME_S: `ray job stop` SIGKILLs a job this long after its SIGTERM (Ray's default 3 s); a
# stopped bench writes its result within that, but needs longer to stop Serve and the engines (docs/running.md)
RAY_JOB_STOP_WAIT_S = 60
RAY_ENV_DEFAULTS = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                    "RAY_JOB_STOP_WAIT_TIME_S": str(RAY_JOB_STOP_WAIT_S)}
NODE_START_TIMEOUT_S = 180.0


RESULT_ROOT_ENV = "PD_ORCHESTRATOR_RESULT_ROOT"  # where a Ray job's relative benchmark.result_dir lands


def job_env() -> dict[str, str]:
    """What a `ray job submit ... -- python ...` entrypoint needs from the raylets we start (it runs in a shell
    with the head raylet's environment): this interpreter's directory first on PATH, so `python` is the
    one with pd-orchestrator installed, and the result root = the directory `cluster up` runs in."""
    path = os.environ.get("PATH") or os.defpath
    return {"PATH": os.pathsep.join([str(Path(sys.executable).parent), path]),
            RESULT_ROOT_ENV: os.environ.get(RESULT_ROOT_ENV) or str(Path.cwd().resolve())}


def ray_env() -> dict[str, str]:
    """This process's environment with RAY_ENV_DEFAULTS filled in where unset (or empty)."""
    return {**RAY_ENV_DEFAULTS, **{k: v for k, v in os.environ.items() if v}}


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
        return all(pid_alive(n.pid) for n in self.nodes) and _port_open(host, int(port))


class LocalCluster:
    """A 2-node Ray cluster on this machine: head labelled prefill, second raylet labelled decode."""

    def __init__(self, cluster: ClusterConfig, state_path: Path = DEFAULT_STATE_PATH,
                 env: dict[str, str] | None = None):
        self.cluster = cluster
        self.state_path = Path(state_path)
        self.state: LocalClusterState | None = None
        self.gpus: dict[str, list[str]] = {}
        self.env = dict(env or {})  # more environment for every raylet (e.g. RAY_AUTH_TOKEN)
        self.alive_at: dict[str, float] = {}  # role -> time.time() its raylet was listed alive (bench's placement steps)

    # Where each raylet runs. Here: this machine, cluster.local.bind_host. NamespaceCluster
    # (cluster/netns/ray_cluster.py) runs each one on its own network-namespace host instead.
    def node_host(self, role: str) -> str:
        """The node IP of the raylet of `role` (what it binds and advertises)."""
        return self.cluster.local.bind_host

    def launch_prefix(self, role: str) -> list[str]:
        """Command prefix of the raylet of `role` (e.g. `ip netns exec <host>`)."""
        return []

    def pick_port(self, role: str) -> int:
        """A free port on the node of `role`."""
        return free_port(self.node_host(role))

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
        host = self.node_host(roles.prefill)
        gcs_port = local.head_port or self.pick_port(roles.prefill)
        dashboard_port = local.dashboard_port or self.pick_port(roles.prefill)
        split = local.gpu_split == "auto"
        self.gpus = gpu_slices(machine_gpus(), self.cluster.gpus_per_node, [roles.prefill, roles.decode]) if split else {}
        root = Path(tempfile.mkdtemp(prefix="pdo-ray-", dir="/tmp"))  # short: Ray's socket paths must fit
        self.alive_at = {}
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
                f"--ray-client-server-port={self.pick_port(roles.prefill)}",
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
                self.alive_at[role] = time.time()
                return
            except NodeExited as exited:
                if exited.pid != self.state.nodes[-1].pid:
                    raise EarlierNodeExited(str(exited), exited.pid) from None
                node = self.state.nodes.pop()
                ManagedProcess.attach(node.pid).stop()
                self.state.save(self.state_path)
                if attempt == attempts - 1:
                    raise

    def _start_node(self, role: str, role_args: list[str], temp_dir: Path) -> LocalNode:
        local = self.cluster.local
        temp_dir.mkdir(parents=True, exist_ok=True)
        host = self.node_host(role)
        metrics_port = self.pick_port(role)
        loopback = is_loopback(host)
        # on loopback Ray's own CLI would rewrite 127.0.0.1 to the outward IP and listen beyond loopback
        ray_cli = [sys.executable, "-m", "orchestrator.cluster.ray_loopback"] if loopback else [_ray_executable()]
        argv = [
            *self.launch_prefix(role),
            *ray_cli,
            "start",
            "--block",
            *role_args,
            f"--node-ip-address={host}",
            f"--num-cpus={local.num_cpus_per_node}",
            f"--num-gpus={self.cluster.gpus_per_node}",
            f"--labels={self.cluster.roles.label_key}={role}",
            f"--object-store-memory={local.object_store_memory_bytes}",
            f"--temp-dir={temp_dir}",
            f"--metrics-export-port={metrics_port}",
            # every port a raylet would otherwise pick for itself comes from ports.free_port's pool
            f"--dashboard-agent-listen-port={self.pick_port(role)}",
            f"--dashboard-agent-grpc-port={self.pick_port(role)}",
            f"--runtime-env-agent-port={self.pick_port(role)}",
            "--disable-usage-stats",
        ]
        gpus = self.gpus.get(role, [])
        gpu_env = {"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else {}
        log_path = temp_dir.parent / f"ray-start-{role}.log"
        env = {**ray_env(), **job_env(), **(LOOPBACK_ENV if loopback else {}), **gpu_env,
               "RAY_NUM_REDIS_GET_RETRIES": "120", **self.env}
        if not loopback:  # a driver of a loopback cluster in this process set them: a routable raylet must not inherit
            for key in LOOPBACK_ENV.keys() - self.env.keys():
                env.pop(key, None)
        # its own session: stop() kills exactly this tree, never by name
        pid = ManagedProcess(argv, log_path, env, what=f"{role} raylet").start()
        return LocalNode(role, pid, str(temp_dir), metrics_port, str(log_path), gpus)

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
            dead = [n for n in self.state.nodes if not pid_alive(n.pid) or reap(n.pid)]
            if dead:
                node = dead[0]
                raise NodeExited(
                    f"local Ray node role={node.role} exited during start-up; see {node.log_path}:\n"
                    + tail(node.log_path, 15),
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
            sessions = _sessions([node.pid, *descendants(node.pid)])
            ManagedProcess.attach(node.pid).stop()
            _kill_sessions(sessions - {os.getsid(0)})
        if state.root_dir and Path(state.root_dir).name.startswith("pdo-ray-"):
            shutil.rmtree(state.root_dir, ignore_errors=True)
        saved = LocalClusterState.load(self.state_path)
        if saved is not None and saved.gcs_address == state.gcs_address:
            self.state_path.unlink(missing_ok=True)
        self.state = None


def _sessions(pids: list[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            out.add(os.getsid(pid))
        except ProcessLookupError:
            pass
    return out


def _proc_session(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, ValueError, IndexError):
        return None


def _kill_sessions(sessions: set[int], timeout_s: float = 5.0) -> None:
    """SIGKILL what is left in the sessions a node's processes ran in.

    A process tree is not enough: Ray's job supervisor starts a watcher shell in its own session
    (`while kill -s 0 <supervisor>; do sleep 1; done; ...`); killed, it leaves the `sleep` it was
    waiting on as an orphan that the tree no longer reaches."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [int(e) for e in os.listdir("/proc") if e.isdigit() and _proc_session(int(e)) in sessions]
        left = [p for p in left if pid_alive(p)]
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)  # a SIGKILLed process leaves /proc once its parent reaps it


# ---- attaching and checking -------------------------------------------------------------------


# ---- CLI ------------------------------------------------------------------------------------------


