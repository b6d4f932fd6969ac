"""Fixtures of the multi-host tests: one lab of network namespaces (node-a, node-b, client on a switch)
and one Ray cluster across it (head role=prefill on node-a, raylet role=decode on node-b) with Ray token
auth on, shared by the session; both are removed afterwards, also when a test fails.

Every test here carries the `netns` marker. Where namespaces cannot be created (not root, no iproute2) they
are skipped with that reason in the summary (`-rs`), unless PDO_REQUIRE_NETNS=1 (set by .ci/run): then the
whole module fails, so CI can never pass by skipping them.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from orchestrator.cluster.netns.lab import NetnsLab, unavailable_reason
from orchestrator.cluster.netns.leftovers import cleanup_leftovers
from orchestrator.cluster.netns.ray_cluster import NamespaceCluster
from tests.multihost.lab import HostCluster
from tests.support import sim_config

_REASON = unavailable_reason()
REQUIRED = os.environ.get("PDO_REQUIRE_NETNS") == "1"


def pytest_collection_modifyitems(config, items) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent != here:
            continue
        item.add_marker(pytest.mark.netns)
        if _REASON is not None and not REQUIRED:
            item.add_marker(pytest.mark.skip(reason=f"needs network namespaces (marker netns): {_REASON}"))


@pytest.fixture(scope="session", autouse=True)
def _namespaces_required() -> None:
    if _REASON is not None and REQUIRED:
        pytest.fail(f"PDO_REQUIRE_NETNS=1 but network namespaces cannot be created here: {_REASON}")


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
