"""Local cluster: labelled nodes with logical GPUs, `cluster up/status/down` stops exactly its own
processes (never another cluster's), and a `cluster: local` config attaches to RAY_ADDRESS instead of
starting a second cluster (the `ray job submit` case)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cluster.local import LocalClusterState
from orchestrator.process import descendants as _descendants
from orchestrator.process import pid_alive as _pid_alive

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"},
    )


def test_nodes_carry_role_labels_and_logical_gpus(ray_driver):
    from orchestrator.cluster.inventory import node_inventory

    nodes = node_inventory()
    assert sorted(n.labels.get("role") for n in nodes) == ["decode", "prefill"]
    assert all(n.gpus == 8 and n.cpus == 4 for n in nodes)
    assert all(_pid_alive(node.pid) for node in ray_driver.nodes)


def test_cluster_down_stops_exactly_the_processes_it_started(ray_cluster, tmp_path):
    state_path = tmp_path / "own-cluster.json"
    up = _cli("cluster", "up", "--local", "--state", str(state_path))
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        state = LocalClusterState.load(state_path)
        assert state is not None and len(state.nodes) == 2
        assert [n.role for n in state.nodes] == ["prefill", "decode"]
        started = [p for n in state.nodes for p in (n.pid, *_descendants(n.pid))]
        assert len(started) > 4  # gcs, raylets, dashboard, agents ...

        status = _cli("cluster", "status", "--state", str(state_path))
        assert status.returncode == 0 and "up" in status.stdout

        down = _cli("cluster", "down", "--state", str(state_path))
        assert down.returncode == 0, down.stderr[-2000:]
        assert [p for p in started if _pid_alive(p)] == []
        assert not Path(state.root_dir).exists() and not state_path.exists()
        # the session cluster (another "user" of this machine) is untouched
        assert ray_cluster.alive()
        assert _cli("cluster", "status", "--state", str(state_path)).returncode == 1
    finally:
        if state_path.exists():  # the test failed before `down` finished: do not leave the cluster running
            _cli("cluster", "down", "--state", str(state_path))


def test_local_config_attaches_to_ray_address_instead_of_starting(ray_cluster, tmp_path):
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from tests.support import sim_config\n"
        "from orchestrator.cluster.connect import connect\nfrom orchestrator.cluster.inventory import node_inventory\n"
        f"s = connect(sim_config(tmp_dir=Path({str(tmp_path)!r})))\n"
        "print(json.dumps({'started': s.started is not None, 'nodes': len(node_inventory())}))\n"
        "s.close()\n"
    )
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.gcs_address, "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"started": False, "nodes": 2}
    assert not (tmp_path / "local-cluster.json").exists()


def test_each_local_node_gets_its_own_gpus_on_a_gpu_machine(monkeypatch):
    from orchestrator.cluster.inventory import ClusterError, gpu_slices, machine_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3, 4,5,6,7")
    assert gpu_slices(machine_gpus(), 4, ["prefill", "decode"]) == {"prefill": ["0", "1", "2", "3"],
                                                                   "decode": ["4", "5", "6", "7"]}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # a user's own selection is sliced, not renumbered
    assert gpu_slices(machine_gpus(), 1, ["prefill", "decode"]) == {"prefill": ["3"], "decode": ["5"]}
    with pytest.raises(ClusterError, match=r"cluster.gpus_per_node=8: 2 local nodes need 16 GPUs, this machine "
                                           r"has 2 \(3,5\); set cluster.gpus_per_node: 1"):
        gpu_slices(machine_gpus(), 8, ["prefill", "decode"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_slices(machine_gpus(), 8, ["prefill", "decode"]) == {}  # no GPU: logical GPUs only


def test_a_node_that_dies_while_the_next_one_starts_makes_the_cluster_start_over(ray_cluster, tmp_path):
    """CI once lost the head raylet while the decode raylet started (a port the head opens late was
    taken in between); start() must start the whole cluster over instead of failing."""
    from orchestrator.cluster.local import LocalCluster
    from orchestrator.process import ManagedProcess
    from tests.support import sim_config

    killed: list[int] = []

    class HeadDiesOnce(LocalCluster):
        def _start_node(self, role, role_args, temp_dir):
            if role == "decode" and not killed:
                killed.append(self.state.nodes[0].pid)
                ManagedProcess.attach(killed[0]).stop()
            return super()._start_node(role, role_args, temp_dir)

    cluster = HeadDiesOnce(sim_config().cluster, tmp_path / "restarted.json")
    try:
        state = cluster.start()
        assert killed and state.nodes[0].pid != killed[0]
        assert [n.role for n in state.nodes] == ["prefill", "decode"]
        assert all(_pid_alive(n.pid) for n in state.nodes) and cluster._alive_node_count() == 2
    finally:
        cluster.stop()
    assert ray_cluster.alive()
