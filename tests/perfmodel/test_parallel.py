"""PP micro-batch overlap, DP attention and dummy-weight routing from their mechanism: the directions the
published runs show come out of per-GPU step costs and published collective times, not a fitted factor."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.config.model_presets import DEEPSEEK_R1, DEEPSEEK_V2_LITE
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.parallel import collectives, pipeline
from orchestrator.perfmodel.timing import mla_passes
from orchestrator.perfmodel.weights import dummy_routing, experts_hit_fraction
from orchestrator.plan.backtest import run_backtest
from orchestrator.plan.runs import synthetic_batch
from orchestrator.plan.search import search_layouts

ROOT = Path(__file__).resolve().parents[2]
H200_2X8 = ROOT / "configs/h200-agg-tp16.yaml"
PP_DPATTN = ["layout.aggregated.0.tp=8", "layout.aggregated.0.pp=2", "layout.aggregated.0.dp=2",
             "layout.aggregated.0.dp_attention=true"]


@pytest.fixture(scope="module")
def rows():
    return {r.id: r for r in run_backtest()}


def test_predicted_pp_and_dp_attention_gains_are_above_one(rows) -> None:
    pp = rows["h200x16-r1-tp8-pp2-dpattn2-team"].predicted / rows["h200x16-r1-tp16-team"].predicted
    dpattn = rows["h200x8-r1-tp8-dpattn-gpustack"].predicted / rows["h200x8-r1-tp8-gpustack"].predicted
    assert pp > 1.2 and dpattn > 1.02  # published: x1.65 and x1.08
    assert rows["knob-pp2-microbatch-vs-tp16"].predicted == "up" and rows["knob-dp-attention-tp8"].predicted == "up"


def test_tp8_pp2_dp_attention_ranks_above_tp16_on_2x8_h200() -> None:
    cfg = load_config(H200_2X8, ["benchmark.num_prompts=2000", "engine.sglang.load_format=dummy"])
    ranked = [c.label for c in search_layouts(cfg, synthetic_batch(2000, 2025), tune_top=0)]
    assert "agg 1AxTP8xPP2DP2-attn" in ranked and "agg 1AxTP16" in ranked
    assert ranked.index("agg 1AxTP8xPP2DP2-attn") < ranked.index("agg 1AxTP16")


def test_a_pp_round_overlaps_the_scheduler_step_and_pays_one_stage_per_micro_batch() -> None:
    assert pipeline.decode_round_s(0.010, 2, 100, 0.003) == pytest.approx(0.020)  # hidden behind the other stage
    assert pipeline.decode_round_s(0.010, 2, 1, 0.003) == pytest.approx(0.023)  # one request: nothing to overlap
    assert pipeline.bubble_factor(2) == pytest.approx(1.5) and pipeline.bubble_factor(2, 100) == pytest.approx(1.01)
    cfg = load_config(H200_2X8, ["benchmark.num_prompts=2000", *PP_DPATTN])
    role, _, group = next(iter(cfg.layout.groups()))
    model = cost_model_for(cfg, role, group)
    # a round of 512 requests costs less than two unpipelined passes of the whole model over them
    assert model.decode_step_s(512, 512 * 600) < 2 * model._decode_pass_s(512, 512 * 600, False, 1)


def test_collectives_follow_the_published_latency_and_bandwidth() -> None:
    links = collectives.HOPPER
    small, big = 7168 * 2, 1024 * 7168 * 2
    assert collectives.allreduce_s(small, 8, 1, links) == pytest.approx(links.intra_latency_s, rel=0.01)
    assert collectives.allreduce_s(small, 16, 2, links) == pytest.approx(links.inter_latency_s, rel=0.01)
    assert collectives.allreduce_s(big, 16, 2, links) > collectives.allreduce_s(big, 8, 1, links)
    assert collectives.allreduce_s(big, 1, 1, links) == 0.0
    assert collectives.p2p_send_s(big, True, links) > collectives.p2p_send_s(big, False, links)
    assert collectives.alltoall_s(big, 16, 2, links) > collectives.alltoall_s(big, 8, 1, links)


def test_dummy_weights_route_every_token_to_the_same_experts_under_a_biased_router() -> None:
    assert dummy_routing("dummy", DEEPSEEK_R1.topk_method) and not dummy_routing("auto", DEEPSEEK_R1.topk_method)
    assert not dummy_routing("dummy", DEEPSEEK_V2_LITE.topk_method)  # greedy softmax: no per-expert bias
    assert experts_hit_fraction(512, 8, 256, same_experts=True) == pytest.approx(8 / 256)
    assert experts_hit_fraction(512, 8, 256) == pytest.approx(1.0, abs=1e-6)
    assert DEEPSEEK_R1.topk_method == "noaux_tc" and DEEPSEEK_V2_LITE.topk_method == "greedy"


def test_mla_latent_reads_follow_the_kernels_head_tiles() -> None:
    assert mla_passes(128, "triton") == 8 and mla_passes(16, "triton") == 1  # BLOCK_H = 16
    assert mla_passes(128, "fa3") == 2 and mla_passes(16, None) == 1
