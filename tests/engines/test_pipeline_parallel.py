"""`pp` of a worker group reaches every stage: SGLang's argv, the simulated server, placement, the cost model."""

from __future__ import annotations

import argparse

from deployments.app import worker_deployment_options
from orchestrator.config import config_from_dict
from orchestrator.engines.base import WorkerPlacement
from orchestrator.engines.sglang.launch import build_argv
from orchestrator.engines.sim.backend import SimBackend
from orchestrator.engines.sim.settings import add_server_args, architecture_of, cost_model_of, settings_from_args
from orchestrator.perfmodel.costmodel import cost_model_for


def tp8_pp2(kind: str):
    """Aggregated TP8xPP2 over two 8-GPU nodes: one server, 16 GPUs, one pipeline stage per node."""
    return config_from_dict({
        "cluster": {"num_nodes": 2, "gpus_per_node": 8, "gpu": "H200"},
        "model": {"preset": "DeepSeek-R1", "quantization": "fp8"},
        "engine": {"kind": kind, "sim": {"profile": "H200"}},
        "layout": {"mode": "aggregated", "aggregated": [{"count": 1, "tp": 8, "pp": 2, "nnodes": 2}]},
    })


def placement(node_rank: int = 0, gpu_ids=tuple(range(8))) -> WorkerPlacement:
    return WorkerPlacement(role="aggregated", group_index=0, replica_index=0, host="10.0.0.1",
                           advertise_host="10.0.0.1", port=30000, gpu_ids=gpu_ids, node_ip="10.0.0.1",
                           nnodes=2, node_rank=node_rank, dist_init_addr="10.0.0.1:5000")


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_sglang_argv_carries_pp_size():
    cfg = tp8_pp2("sglang")
    argv = build_argv(cfg, cfg.layout.aggregated[0], placement())
    assert (flag(argv, "--tp-size"), flag(argv, "--pp-size"), flag(argv, "--nnodes")) == ("8", "2", "2")


def test_placement_reserves_every_stage_gpus_one_stage_per_node():
    cfg = tp8_pp2("sglang")
    options = worker_deployment_options(cfg, "aggregated", cfg.layout.aggregated[0])
    bundles = options["placement_group_bundles"]
    assert [b["GPU"] for b in bundles] == [8, 8]  # 16 GPUs: TP8 on each node, not TP8 on one
    assert options["placement_group_strategy"] == "STRICT_SPREAD"


def test_simulated_server_models_the_pipeline():
    cfg = tp8_pp2("sim")
    launch = SimBackend().build_launch(cfg, cfg.layout.aggregated[0], placement())
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    settings = settings_from_args(parser.parse_args(launch.argv[3:]))
    assert settings.spec.parallel.pp == 2
    cost = cost_model_of(settings, architecture_of(settings))
    flat = cost_model_of(settings_from_args(parser.parse_args([*launch.argv[3:], "--pp-size", "1"])),
                         architecture_of(settings))
    assert cost.pp == 2 and cost.gpus == 16
    # each stage holds half the layers: per-GPU weights drop, KV capacity per server grows
    assert cost.weights_bytes_per_gpu() < flat.weights_bytes_per_gpu()


def test_planner_cost_model_reads_pp_from_the_group_not_extra_args():
    cfg = tp8_pp2("sim")
    group = cfg.layout.aggregated[0]
    assert group.extra_args == []  # pp comes from the typed field only
    model = cost_model_for(cfg, "aggregated", group)
    one_stage = cost_model_for(cfg, "aggregated", group.model_copy(update={"pp": 1, "nnodes": 1}))
    assert (model.pp, model.gpus) == (2, 16)
    # each stage holds half the layers: about half the weight bytes per GPU of TP8 with every layer
    assert model.weights_bytes_per_gpu() < 0.6 * one_stage.weights_bytes_per_gpu()
