"""A Ray cluster across a network-namespace lab's hosts: LocalCluster's 2-node start-up, one raylet per host."""

from __future__ import annotations

from pathlib import Path

from orchestrator.cluster.batch import alive_nodes
from orchestrator.cluster.local import NODE_START_TIMEOUT_S, LocalCluster
from orchestrator.cluster.netns.lab import NetnsLab
from orchestrator.cluster.ports import free_port
from orchestrator.config import ClusterConfig
from orchestrator.process import pid_alive, reap


class NamespaceCluster(LocalCluster):
    """The local 2-node cluster with each raylet on its own lab host, started with that host's address.

    Head (role prefill) on node-a, second raylet (role decode) on node-b: LocalCluster's own start-up,
    with each raylet's command prefixed by `ip netns exec <host>`, its node IP the host's address, and
    ports picked inside that host. Readiness is asked from the client host (the only way in).
    """

    def __init__(self, cluster: ClusterConfig, lab: NetnsLab, state_path: Path, env: dict[str, str] | None = None,
                 hosts: dict[str, str] | None = None, probe_from: str = "client"):
        super().__init__(cluster, state_path, env=env)
        self.lab = lab
        self.role_hosts = hosts or {cluster.roles.prefill: "node-a", cluster.roles.decode: "node-b"}
        self.probe_from = probe_from
        self.restarts = 0

    def node_host(self, role: str) -> str:
        return self.lab.hosts[self.role_hosts[role]].ip

    def launch_prefix(self, role: str) -> list[str]:
        return self.lab.prefix(self.role_hosts[role])

    def pick_port(self, role: str) -> int:
        return self.lab.call(self.role_hosts[role], free_port, self.node_host(role))

    def _alive_node_count(self) -> int:
        assert self.state is not None
        return self.lab.call(self.probe_from, alive_node_count, self.state.dashboard_url, self.env.get("RAY_AUTH_TOKEN"))

    def start_node(self, role: str) -> None:
        """(Re)start the raylet of `role` on its host (after a fault killed it) and wait until it is alive."""
        assert self.state is not None
        for node in [n for n in self.state.nodes if n.role == role]:  # the dead raylet is no longer ours to wait on
            reap(node.pid)
            if not pid_alive(node.pid):
                self.state.nodes.remove(node)
        alive = self._alive_node_count()
        args = [] if role == self.cluster.roles.prefill else [f"--address={self.state.gcs_address}"]
        self.restarts += 1  # a fresh temp dir: never a dead raylet's session (short: Ray's socket paths must fit)
        temp_dir = Path(self.state.root_dir) / f"{role}-r{self.restarts}"
        self._start_with_retries(role, args, temp_dir, alive + 1, NODE_START_TIMEOUT_S)


def alive_node_count(dashboard_url: str, token: str | None = None, timeout_s: float = 10.0) -> int:
    """ALIVE nodes per the dashboard's state API (with the Ray token as a Bearer header); 0 if no answer."""
    return len(alive_nodes(dashboard_url, token, timeout_s))
