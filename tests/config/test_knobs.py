"""Tuning knobs as typed config fields: each reaches SGLang 0.5.17's argv, the placement (GPU count) and the cost model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.config import ConfigError, config_from_dict, load_config
from orchestrator.engines.base import WorkerPlacement
from orchestrator.engines.sglang.launch import build_argv
from orchestrator.plan.simulation.simulate import simulate_run, synthetic_batch
from orchestrator.perfmodel.costmodel import cost_model_for

ROOT = Path(__file__).resolve().parents[2]
BATCH = synthetic_batch(300, seed=3)


def _config(layout: dict, **engine: object) -> object:
    data = yaml.safe_load((ROOT / "configs/h100-agg-tp16.yaml").read_text())
    data["layout"] = layout
    data["engine"]["sglang"].update(engine)
    return config_from_dict(data)


def _argv(cfg, role: str = "aggregated", gpus: int = 8, node_rank: int = 0) -> list[str]:
    group = getattr(cfg.layout, role)[0]
    placement = WorkerPlacement(
        role=role, group_index=0, replica_index=0, host="10.0.0.1", advertise_host="10.0.0.1", port=30000,
        bootstrap_port=8998 if role == "prefill" else None, gpu_ids=tuple(range(gpus)), node_ip="10.0.0.1",
        nnodes=group.nnodes, node_rank=node_rank, dist_init_addr="10.0.0.1:5000" if group.nnodes > 1 else None,
    )
    return build_argv(cfg, group, placement)


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_pp_reaches_argv_and_the_gpu_count():
    cfg = _config({"mode": "aggregated", "aggregated": [{"tp": 8, "pp": 2, "nnodes": 2}]})
    group = cfg.layout.aggregated[0]
    assert group.gpus_per_server == 16  # placement reserves tp x pp GPUs: 8 per node over 2 nodes
    argv = _argv(cfg, node_rank=1)
    assert (_flag(argv, "--tp-size"), _flag(argv, "--pp-size"), _flag(argv, "--nnodes"), _flag(argv, "--node-rank")) == (
        "8", "2", "2", "1")
    assert cost_model_for(cfg, "aggregated", group).pp == 2


def test_dp_attention_with_ep_reaches_argv():
    cfg = _config({"mode": "aggregated", "aggregated": [
        {"tp": 16, "dp": 16, "dp_attention": True, "ep": 16, "moe_a2a_backend": "deepep", "nnodes": 2}]})
    argv = _argv(cfg)
    assert (_flag(argv, "--tp-size"), _flag(argv, "--dp-size"), _flag(argv, "--ep-size")) == ("16", "16", "16")
    assert "--enable-dp-attention" in argv and _flag(argv, "--moe-a2a-backend") == "deepep"
    assert cfg.layout.aggregated[0].gpus_per_server == 16  # DP attention lives inside the TP group


def test_batch_caps_mem_fraction_chunk_and_attention_reach_argv():
    cfg = _config({"mode": "aggregated", "aggregated": [{
        "tp": 16, "nnodes": 2, "max_running_requests": 1024, "cuda_graph_max_bs": 1024,
        "mem_fraction_static": 0.88, "chunked_prefill_size": 16384, "attention_backend": "flashmla"}]},
        page_size=64, mem_fraction_static=0.8)
    argv = _argv(cfg)
    assert _flag(argv, "--max-running-requests") == "1024"
    assert _flag(argv, "--cuda-graph-max-bs-decode") == "1024"  # 0.5.17's name; --cuda-graph-max-bs is deprecated
    assert _flag(argv, "--mem-fraction-static") == "0.88"  # the group's value wins over engine.sglang's
    assert _flag(argv, "--chunked-prefill-size") == "16384"
    assert _flag(argv, "--attention-backend") == "flashmla" and _flag(argv, "--page-size") == "64"
    model = cost_model_for(cfg, "aggregated", cfg.layout.aggregated[0])
    assert (model.max_running(), model.graph_max_bs, model.mem_fraction_static, model.chunked_prefill_tokens) == (
        1024, 1024, 0.88, 16384)


def test_speculative_decoding_reaches_argv_on_both_pd_roles():
    spec = {"algorithm": "NEXTN", "num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 2}
    data = yaml.safe_load((ROOT / "configs/h200-1p1d-tp8.yaml").read_text())
    data["layout"]["prefill"][0]["speculative"] = spec
    data["layout"]["decode"][0]["speculative"] = spec
    cfg = config_from_dict(data)
    for role in ("prefill", "decode"):
        argv = _argv(cfg, role)
        assert [_flag(argv, f) for f in ("--speculative-algorithm", "--speculative-num-steps",
                                         "--speculative-eagle-topk", "--speculative-num-draft-tokens")] == [
            "NEXTN", "1", "1", "2"]
    assert "--speculative-algorithm" not in _argv(load_config(ROOT / "configs/h200-1p1d-tp8.yaml"), "decode")


def test_speculative_decoding_costs_memory_and_pays_only_with_real_weights():
    layout = {"mode": "aggregated", "aggregated": [{"tp": 16, "nnodes": 2, "max_running_requests": 512,
                                                    "cuda_graph_max_bs": 512}]}
    plain = _config(layout)
    spec_layout = {"mode": "aggregated", "aggregated": [{**layout["aggregated"][0],
                                                         "speculative": {"num_steps": 3, "num_draft_tokens": 4}}]}
    dummy, real = _config(spec_layout), _config(spec_layout, load_format=None)
    m_plain, m_dummy, m_real = (cost_model_for(c, "aggregated", c.layout.aggregated[0]) for c in (plain, dummy, real))
    assert m_dummy.weights_bytes_per_gpu() > m_plain.weights_bytes_per_gpu()  # the MTP layer
    assert m_dummy.kv_capacity_tokens() < m_plain.kv_capacity_tokens()  # its KV layer
    assert m_dummy.decode_tokens_per_step == 1.0  # random weights: drafts rejected (assumption)
    assert 2.5 < m_real.decode_tokens_per_step < 3.0
    base = simulate_run(plain, BATCH).output_throughput
    assert simulate_run(dummy, BATCH).output_throughput < base < simulate_run(real, BATCH).output_throughput




def test_attention_backend_reaches_the_cost_model():
    fa3 = _config({"mode": "aggregated", "aggregated": [{"tp": 16, "nnodes": 2}]})
    triton = _config({"mode": "aggregated", "aggregated": [{"tp": 16, "nnodes": 2, "attention_backend": "triton"}]})
    m_fa3, m_triton = (cost_model_for(c, "aggregated", c.layout.aggregated[0]) for c in (fa3, triton))
    assert m_triton.decode_step_s(64, 64 * 500) == pytest.approx(m_fa3.decode_step_s(64, 64 * 500) / 0.94)
    assert simulate_run(triton, BATCH).output_throughput < simulate_run(fa3, BATCH).output_throughput


@pytest.mark.parametrize("group, message", [
    ({"tp": 8, "dp": 3, "dp_attention": True}, "dp_attention needs dp >= 2 dividing tp"),
    ({"tp": 8, "ep": 4}, "ep is 1 or tp=8"),
    ({"tp": 8, "moe_a2a_backend": "deepep"}, "moe_a2a_backend=deepep needs ep = tp > 1"),
    ({"tp": 8, "attention_backend": "fa9"}, "is not an MLA backend"),
    ({"tp": 8, "speculative": {"num_steps": 1, "num_draft_tokens": 4}}, "num_draft_tokens=4 exceeds"),
    ({"tp": 8, "cuda_graph_max_bs": 0}, "cuda_graph_max_bs"),
])
def test_bad_knob_values_are_one_line_naming_the_field(group, message):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"layout": {"mode": "aggregated", "aggregated": [group]}}, "t.yaml")
    assert message in str(err.value) and len(err.value.problems) == 1


def test_flashmla_needs_page_size_64_and_pd_roles_share_speculative():
    with pytest.raises(ConfigError, match="set engine.sglang.page_size: 64"):
        config_from_dict({"layout": {"mode": "aggregated", "aggregated": [{"tp": 8, "attention_backend": "flashmla"}]}})
    with pytest.raises(ConfigError, match="same speculative algorithm"):
        config_from_dict({"layout": {"prefill": [{"tp": 8}], "decode": [{"tp": 8, "speculative": {}}]}})
