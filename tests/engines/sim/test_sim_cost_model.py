"""A simulated server is timed by the cost model the planner uses for the same group: both are built by
perfmodel/costmodel.py build_cost_model, the sim from the command line its backend writes."""

from __future__ import annotations

import argparse

import pytest

from orchestrator.config import load_config
from orchestrator.engines.base import WorkerPlacement
from orchestrator.engines.sim.backend import SimBackend
from orchestrator.engines.sim.settings import add_server_args, architecture_of, cost_model_of, settings_from_args
from orchestrator.perfmodel.costmodel import cost_model_for


def sim_cost_model(cfg, role: str, group):
    placement = WorkerPlacement(role=role, group_index=0, replica_index=0, host="127.0.0.1",
                                advertise_host="127.0.0.1", port=30000, bootstrap_port=8998)
    argv = SimBackend().build_launch(cfg, group, placement).argv
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    settings = settings_from_args(parser.parse_args(argv[3:]))  # after [python, -m, module]
    return cost_model_of(settings, architecture_of(settings))


def what_the_run_sees(model) -> dict:
    return {
        "kv_capacity_tokens": model.kv_capacity_tokens(),
        "max_running": model.max_running(),
        "chunked_prefill_tokens": model.chunked_prefill_tokens,
        "mem_fraction_static": model.mem_fraction_static,
        "calibration": model.calibration.profile if model.calibration else None,
        "page_size": model.page_size,
        "graph_max_bs": model.graph_max_bs,
        "attention_backend": model.attention_backend,
        "sglang_version": model.sglang_version,
        "graphs": (model.cuda_graph, model.prefill_graphs),
        "speculative": model.speculative,
        "decode_step_s": [model.decode_step_s(bs, bs * 1000) for bs in (8, 64, 512)],
        "prefill_time_s": model.prefill_time_s([3000, 500], [0, 100]),
        "kv_transfer_s": model.kv_transfer_s(1000, same_node=False),
    }


@pytest.mark.parametrize("overrides", [
    [],  # the README's default: R1 W4A8, 1 prefill TP8 + 1 decode TP8 on H100
    ["engine.sglang.mem_fraction_static=0.8", "layout.decode.0.max_running_requests=256"],
    ["layout.prefill.0.chunked_prefill_size=4096", "cluster.gpu_memory_gb=70"],
    ["engine.sglang.page_size=64", "layout.decode.0.cuda_graph_max_bs=64", "layout.decode.0.attention_backend=triton"],
    ["layout.decode.0.disable_cuda_graph=true", "engine.sglang.version=0.4.10"],
    ["layout.prefill.0.disable_prefill_cuda_graph=true", "layout.prefill.0.speculative={num_steps: 2, num_draft_tokens: 3}",
     "layout.decode.0.speculative={num_steps: 2, num_draft_tokens: 3, accept_length: 2.5}"],
])
def test_the_sim_server_and_the_planner_build_the_same_cost_model(overrides) -> None:
    cfg = load_config("configs/default.yaml", overrides)
    for role in ("prefill", "decode"):
        group = getattr(cfg.layout, role)[0]
        assert what_the_run_sees(sim_cost_model(cfg, role, group)) == what_the_run_sees(cost_model_for(cfg, role, group))


@pytest.mark.parametrize(("overrides", "one_link"), [
    ([], False),  # the default's two 8-GPU nodes: each role's node is its own machine
    (["cluster.single_host=true", "cluster.gpus_per_node=1", "layout.prefill.0.tp=1", "layout.decode.0.tp=1",
      "model.preset=DeepSeek-V2-Lite", "model.quantization=bf16"], True),  # two raylets of one lent host
])
def test_the_sim_servers_share_a_kv_link_where_the_planner_prices_nvlink(overrides, one_link) -> None:
    cfg = load_config("configs/default.yaml", overrides)
    nodes = []
    for role in ("prefill", "decode"):
        placement = WorkerPlacement(role=role, group_index=0, replica_index=0, host="127.0.0.1",
                                    advertise_host="127.0.0.1", port=30000, bootstrap_port=8998)
        argv = SimBackend().build_launch(cfg, getattr(cfg.layout, role)[0], placement).argv
        nodes.append(argv[argv.index("--sim-node") + 1])
    assert (nodes[0] == nodes[1]) is one_link  # the engine's same_node: its NVLink figure
