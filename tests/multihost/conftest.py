"""Fixtures of the multi-host tests: one lab of network namespaces (node-a, node-b, client on a switch)
and one Ray cluster across it (head role=prefill on node-a, raylet role=decode on node-b) with Ray token
auth on, shared by the session; both are removed afterwards, also when a test fails.

Skipped, with the reason, only where namespaces cannot be created (not root, no iproute2).
"""

from __future__ import annotations

import secrets

import pytest

from orchestrator.cluster.netns import NamespaceCluster, NetnsLab, cleanup_leftovers, unavailable_reason
from tests.multihost.lab import HostCluster
from tests.support import sim_config

_REASON = unavailable_reason()
if _REASON is not None:
    pytest.skip(f"multi-host tests need network namespaces: {_REASON}", allow_module_level=True)


@pytest.fixture(scope="session")
def lab():
    cleanup_leftovers()  # namespaces of runs that were killed before they could clean up
    with NetnsLab() as created:
        yield created
    assert not created.namespaces(), f"namespaces left behind: {created.namespaces()}"


@pytest.fixture(scope="session")
def hosts(lab: NetnsLab, tmp_path_factory) -> HostCluster:
    token = "pdo-multihost-" + secrets.token_hex(16)
    cfg = sim_config()
    cluster = NamespaceCluster(cfg.cluster, lab, tmp_path_factory.mktemp("ns-cluster") / "cluster.json",
                               env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    state = cluster.start()
    try:
        yield HostCluster(lab, cluster, state, token)
    finally:
        cluster.stop()
