"""Shared fixtures: one local labelled 2-node Ray cluster per test session, a driver attached to it,
and small sim-engine configs on free ports.

Starting a cluster costs ~15-20 s on the CI box, so every Ray test module should use `ray_cluster`
(and `ray_driver` when it needs `ray.*` calls) rather than starting its own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import pytest

# Every Ray process and client in tests: no usage stats, no token auth (see notes/ray.md §6).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ["RAY_AUTH_MODE"] = "disabled"
os.environ.setdefault("UCX_NET_DEVICES", "lo")

from orchestrator.cluster.connect import init_driver
from orchestrator.cluster.local import LocalCluster, LocalClusterState
from orchestrator.cluster.ports import free_port
from orchestrator.config import RunConfig, config_from_dict


def wait_until(predicate: Callable[[], object], timeout_s: float, poll_s: float = 0.25):
    """Poll `predicate` until it returns something truthy; fail the test with a message on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s:.0f}s")
        time.sleep(poll_s)


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


def sim_config(overrides: dict | None = None, prefill: list[dict] | None = None, decode: list[dict] | None = None,
               tmp_dir: Path | None = None) -> RunConfig:
    """A small simulated-engine config: cpu-fast profile, fast start-up, free router port."""
    data: dict = {
        "name": "test",
        # cluster.gpu cpu-fast: the memory preflight checks the target GPU, and R1's own tokenizer
        # (the packaged fallback) must match the model's vocabulary
        "cluster": {"address": "local", "gpu": "cpu-fast", "gpus_per_node": 8, "num_nodes": 2},
        "model": {"preset": "DeepSeek-R1", "quantization": "w4a8"},
        "engine": {"kind": "sim", "sim": {"profile": "cpu-fast", "startup_s": 0.0, "time_scale": 1.0}},
        "layout": {"mode": "pd", "prefill": prefill or [{"count": 1, "tp": 1}],
                   "decode": decode or [{"count": 1, "tp": 1}]},
        "benchmark": {"num_prompts": 16, "deadline_s": 300, "warmup": {"policy": "none"},
                      "result_dir": str(tmp_dir or "runs")},
        "router": {"port": free_port()},
    }
    for key, value in (overrides or {}).items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return config_from_dict(data, "tests/conftest.py")


@pytest.fixture
def make_sim_config(tmp_path) -> Callable[..., RunConfig]:
    """Factory for `sim_config` with the result dir under this test's tmp dir."""

    def make(**kwargs) -> RunConfig:
        return sim_config(tmp_dir=tmp_path, **kwargs)

    return make
