"""What the multi-host tests hold of their lab: the namespaces, the Ray cluster on them and its auth token
(built by the session fixture `hosts` in conftest.py; test modules import the type from here, not from conftest)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from orchestrator.cluster.local import LocalClusterState
from orchestrator.cluster.netns.lab import NetnsLab
from orchestrator.cluster.netns.ray_cluster import NamespaceCluster


@dataclass
class HostCluster:
    """The namespace lab, the Ray cluster on it, and the token every node and client of it uses."""

    lab: NetnsLab
    cluster: NamespaceCluster
    state: LocalClusterState
    token: str

    def env(self, with_token: bool = True) -> dict[str, str]:
        """Environment of a client of this cluster: token auth on, the token only if `with_token`."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", PYTHONUNBUFFERED="1")
        if with_token:
            env["RAY_AUTH_TOKEN"] = self.token
        return env

    @property
    def head_ip(self) -> str:
        return self.lab.hosts["node-a"].ip
