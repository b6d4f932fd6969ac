"""Shared fixtures: one local labelled 2-node Ray cluster per test session, a driver attached to it,
and small sim-engine configs on free ports.

Starting a cluster costs ~15-20 s on the CI box, so every Ray test module should use `ray_cluster`
(and `ray_driver` when it needs `ray.*` calls) rather than starting its own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest

# Every Ray process and client in tests: no usage stats, no token auth (see notes/ray.md §6).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ.setdefault("UCX_NET_DEVICES", "lo")

from orchestrator.cluster.connect import init_driver
from orchestrator.cluster.local import LocalCluster, LocalClusterState
from orchestrator.config import RunConfig
from tests.support import CASE_LOG, Ingress, sim_config, sim_pd_pair


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory) -> LocalClusterState:
    """A local 2-node cluster (head role=prefill, raylet role=decode, 8 logical GPUs each) for the session."""
    state_path = tmp_path_factory.mktemp("ray-cluster") / "local-cluster.json"
    cfg = sim_config()
    cluster = LocalCluster(cfg.cluster, state_path)
    state = cluster.start()
    yield state
    cluster.stop()


@pytest.fixture(scope="session")
def ray_cluster_state_path(ray_cluster: LocalClusterState, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ray-state") / "local-cluster.json"
    ray_cluster.save(path)
    return path


@pytest.fixture(scope="session")
def ray_driver(ray_cluster: LocalClusterState):
    """This test process attached to the session cluster (namespace pd-orchestrator, quiet logs)."""
    import ray

    init_driver(ray_cluster.gcs_address)
    yield ray_cluster
    ray.shutdown()


@pytest.fixture
def clean_serve(ray_driver):
    """Serve and the worker registry empty before the test and after it (the session cluster is shared)."""
    import ray
    from ray import serve

    from orchestrator.cluster.registry import get_registry

    ray.get(get_registry().clear.remote())
    yield
    serve.shutdown()
    ray.get(get_registry().clear.remote())


@pytest.fixture
def make_sim_config(tmp_path) -> Callable[..., RunConfig]:
    """Factory for `sim_config` with the result dir under this test's tmp dir."""

    def make(**kwargs) -> RunConfig:
        return sim_config(tmp_dir=tmp_path, **kwargs)

    return make


# ---- a sim PD pair (module-scoped: one per test module that asks), and the router's HTTP ingress (uvicorn on
# loopback) in front of it: router, sweep, mlperf and accuracy tests

@pytest.fixture(scope="module")
def pd_cfg(tmp_path_factory) -> RunConfig:
    return sim_config(tmp_dir=tmp_path_factory.mktemp("pd"))


@pytest.fixture(scope="module")
def pd_workers(pd_cfg):
    with sim_pd_pair(pd_cfg) as endpoints:
        yield endpoints


@pytest.fixture(scope="module")
def pd_router(pd_cfg, pd_workers):
    from orchestrator.router.core import RouterCore

    core = RouterCore(pd_cfg, run_id="sweep-test")
    core.follow(1, pd_workers)
    ingress = Ingress(core)
    yield ingress.url
    ingress.stop()


# ---- the slow set: `pytest -m "not slow"` is the unit set a developer runs between edits (README, command 2)

SLOW_MARKERS = ("ray", "prometheus", "netns", "slurm")
# fixtures that start a Ray cluster or real engine server processes (tests that start their own carry `slow`)
SLOW_FIXTURES = ("ray_cluster", "ray_driver", "ray_cluster_state_path", "pd_workers", "pd_router")


def pytest_collection_modifyitems(config, items) -> None:
    """Every test of a multi-process set (a Ray cluster, Prometheus, network namespaces, Slurm, real subprocess
    servers) is `slow`, whichever way it says so. Runs after tests/multihost/conftest.py's hook (conftests nearer
    the tests come first) and before pytest's `-m` selection (plugins registered earlier come last)."""
    for item in items:
        if any(item.get_closest_marker(m) for m in SLOW_MARKERS) or set(SLOW_FIXTURES) & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)


_RUNNING: dict[str, object] = {"item": None}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _RUNNING["item"] = item  # before any fixture of the test, module- and session-scoped ones included
    yield


@pytest.fixture(scope="session", autouse=True)
def _engine_servers_only_in_slow_tests():
    """Keeps the unit set honest: a test (or a fixture it uses) that starts a real engine server process must be
    marked `slow`, or it fails saying so."""
    from orchestrator.engines.base import EngineProcess

    start = EngineProcess.start

    def guarded(self) -> None:
        item = _RUNNING["item"]
        if item is not None and item.get_closest_marker("slow") is None:
            pytest.fail(f"{item.nodeid} starts an engine server process ({self.launch.argv[:3]}): mark it "
                        "@pytest.mark.slow (the unit set, `-m 'not slow'`, starts none)", pytrace=False)
        start(self)

    EngineProcess.start = guarded  # type: ignore[method-assign]  # undone below, for the whole session
    yield
    EngineProcess.start = start  # type: ignore[method-assign]


def pytest_terminal_summary(terminalreporter) -> None:
    """The bad-input and fuzz suites' case counts, from what actually ran (tests/support.py log_case)."""
    if not CASE_LOG:
        return
    terminalreporter.write_sep("-", "bad-input and fuzz cases")
    for suite, outcomes in sorted(CASE_LOG.items()):
        shown = ", ".join(f"{outcome} x{n}" for outcome, n in sorted(outcomes.items()))
        terminalreporter.write_line(f"{suite:<40} {sum(outcomes.values()):>5} cases: {shown}")
