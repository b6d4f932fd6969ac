"""Placement: every prefill replica runs on the prefill-labelled node and every decode replica on the
decode-labelled node, as Ray's own state reports it; each replica's GPUs are reserved by its own
placement group on that node; impossible layouts fail before anything is placed."""

from __future__ import annotations

import pytest
import ray
from ray.util.state import list_actors, list_nodes

from deployments.app import deploy, expected_workers, worker_groups
from orchestrator.cluster.inventory import ClusterError, NodeInfo, check_nodes_fit, node_inventory
from orchestrator.cluster.registry import get_registry
from tests.support import wait_until

pytestmark = pytest.mark.ray

LAYOUTS = {
    "2P1D": ([{"count": 2, "tp": 2}], [{"count": 1, "tp": 4}]),
    "1P2D": ([{"count": 1, "tp": 4}], [{"count": 2, "tp": 2}]),
}


def _registered(expected_total: int) -> list | None:
    _, endpoints = ray.get(get_registry().snapshot.remote())
    return endpoints if len(endpoints) >= expected_total else None


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_replicas_sit_on_nodes_of_their_role(layout, ray_driver, clean_serve, make_sim_config):
    prefill, decode = LAYOUTS[layout]
    cfg = make_sim_config(prefill=prefill, decode=decode)
    check_nodes_fit(cfg, node_inventory())
    deploy(cfg, run_id=f"placement-{layout}", timeout_s=120, with_router=False)
    expected = expected_workers(cfg)
    endpoints = wait_until(lambda: _registered(sum(expected.values())), timeout_s=60)

    state = ray_driver
    role_of_node = {n.node_id: n.labels.get("role") for n in list_nodes(address=state.dashboard_url, detail=True)}
    for spec in worker_groups(cfg):
        replicas = list_actors(
            address=state.dashboard_url,
            filters=[("class_name", "=", f"ServeReplica:{spec.app_name}:{spec.deployment}"), ("state", "=", "ALIVE")],
        )
        assert len(replicas) == spec.replicas, f"{spec.deployment}: {len(replicas)} replicas alive"
        assert {role_of_node[a.node_id] for a in replicas} == {spec.node_label}

    # engines report the node they run on, and each node's GPUs are handed out once
    assert sorted(e.role for e in endpoints) == sorted(r for r, n in expected.items() for _ in range(n))
    for endpoint in endpoints:
        assert role_of_node[endpoint.node_id] == endpoint.role
    for role in ("prefill", "decode"):
        ids = [g for e in endpoints if e.role == role for g in e.gpu_ids]
        group = (prefill if role == "prefill" else decode)[0]
        assert len(ids) == len(set(ids)) == group["count"] * group["tp"]


def _nodes(**gpus_by_role: int) -> list[NodeInfo]:
    return [NodeInfo(f"n-{role}", "10.0.0.1", {"role": role}, gpus, 64) for role, gpus in gpus_by_role.items()]


def test_missing_role_label_fails_naming_the_label_and_the_fix(make_sim_config):
    cfg = make_sim_config()
    with pytest.raises(ClusterError, match=r"no node labelled role=decode; start one with `ray start .*--labels role=decode"):
        check_nodes_fit(cfg, _nodes(prefill=8))


def test_too_few_gpus_on_a_role_fails_before_placing(make_sim_config):
    cfg = make_sim_config(decode=[{"count": 3, "tp": 4}])
    with pytest.raises(ClusterError, match=r"layout.decode.0: 3 server\(s\) x 4 GPUs do not fit the nodes labelled role=decode"):
        check_nodes_fit(cfg, _nodes(prefill=8, decode=8))
    check_nodes_fit(cfg, _nodes(prefill=8, decode=8) + [NodeInfo("n-d2", "10.0.0.2", {"role": "decode"}, 8, 64)])


def test_custom_label_key_and_values_are_honoured(make_sim_config):
    cfg = make_sim_config(overrides={"cluster.roles": {"label_key": "pd", "prefill": "p", "decode": "d"}})
    nodes = [NodeInfo("a", "h", {"pd": "p"}, 8, 8), NodeInfo("b", "h", {"pd": "d"}, 8, 8)]
    check_nodes_fit(cfg, nodes)
    with pytest.raises(ClusterError, match="no node labelled pd=d"):
        check_nodes_fit(cfg, nodes[:1])


def test_router_host_naming_a_node_pins_the_router_there_and_no_such_node_fails_before_placing(make_sim_config):
    from deployments.app import router_actor_options

    nodes = [NodeInfo("a", "10.0.0.1", {"role": "prefill"}, 8, 8), NodeInfo("b", "10.0.0.2", {"role": "decode"}, 8, 8)]
    on_b = make_sim_config(overrides={"router.host": "10.0.0.2"})
    assert router_actor_options(on_b, driver_ip="10.0.0.1") == {"num_cpus": 0, "resources": {"node:10.0.0.2": 0.001}}
    check_nodes_fit(on_b, nodes)
    for anywhere in ("0.0.0.0", "::", "127.0.0.1"):  # every node has it: the router goes with the driver
        assert router_actor_options(make_sim_config(overrides={"router.host": anywhere}), driver_ip="10.0.0.1") == \
            {"num_cpus": 0, "resources": {"node:10.0.0.1": 0.001}}
    by_name = make_sim_config(overrides={"router.host": "router.example"})  # a name: unpinned
    assert router_actor_options(by_name, driver_ip="10.0.0.1") == {"num_cpus": 0}
    with pytest.raises(ClusterError, match=r"router\.host=10\.0\.0\.9 is not the address of any node "
                                           r"\(10\.0\.0\.1, 10\.0\.0\.2\); set router\.host to one node's address"):
        check_nodes_fit(make_sim_config(overrides={"router.host": "10.0.0.9"}), nodes)


def test_deployment_options_pin_by_label_and_reserve_one_bundle_per_gpu(make_sim_config):
    from deployments.app import worker_deployment_options

    cfg = make_sim_config(prefill=[{"count": 2, "tp": 4}], decode=[{"count": 1, "tp": 8}])
    opts = worker_deployment_options(cfg, "prefill", cfg.layout.prefill[0])
    assert opts["num_replicas"] == 2
    assert opts["ray_actor_options"] == {"num_cpus": 0, "label_selector": {"role": "prefill"}}
    assert opts["placement_group_bundles"] == [{"GPU": 1, "CPU": 0}] * 4
    assert opts["placement_group_strategy"] == "STRICT_PACK"
    assert opts["placement_group_bundle_label_selector"] == [{"role": "prefill"}]


def test_a_server_spanning_nodes_gets_one_bundle_per_node_on_distinct_nodes(make_sim_config):
    from deployments.app import worker_deployment_options

    cfg = make_sim_config(overrides={"layout": {"mode": "aggregated", "aggregated": [{"tp": 16, "nnodes": 2}]}})
    opts = worker_deployment_options(cfg, "aggregated", cfg.layout.aggregated[0])
    assert opts["placement_group_bundles"] == [{"GPU": 8, "CPU": 0}] * 2
    assert opts["placement_group_strategy"] == "STRICT_SPREAD"
    # rank 0 on a node of the aggregated role, the other rank on any other node
    assert opts["placement_group_bundle_label_selector"] == [{"role": "prefill"}, {}]
    check_nodes_fit(cfg, _nodes(prefill=8, decode=8))
    with pytest.raises(ClusterError, match="spans 2 nodes with 8 GPUs each, but only 1 node"):
        check_nodes_fit(cfg, _nodes(prefill=8))
