"""Profiles matched by the per-GPU layer shard (issue 25, after lease 17): a model no profile measured whose layout gives
a GPU the shard a measured model gives it at some layout takes that model's calibration and says so; lease 17's
32 / 2-head probe at TP 2 holds the 16 query / 1 KV heads of Qwen3-235B at TP 4, so it takes Qwen3's own layer-count
split, not the GPU's lent cross-shape floor. An exact model match wins; a different shard gets nothing lent."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from orchestrator.config.model_presets import MODEL_PRESETS
from orchestrator.perfmodel.calibration_lookup import find_calibration
from orchestrator.perfmodel.costmodel import build_cost_model
from orchestrator.perfmodel.profile import shipped_profiles
from orchestrator.perfmodel.shard import layer_shard

QWEN3 = MODEL_PRESETS["qwen3-235b-a22b-fp8"]
PROBE = replace(QWEN3, num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=2)  # leases 16 / 17
SHIPPED = shipped_profiles()


def _calibration(arch, tp: int, ep: int, profiles=None):
    cal = find_calibration("H200", arch, "fp8", profiles, attention_tp=tp, ep=ep)
    assert cal is not None
    return cal


@pytest.mark.parametrize("ep", [1, 2])
def test_the_32_2_head_layer_at_tp_2_and_the_64_4_head_layer_at_tp_4_share_a_profile(ep: int) -> None:
    assert layer_shard(PROBE, "fp8", 2, ep) == layer_shard(QWEN3, "fp8", 4, ep)
    probe, qwen3 = _calibration(PROBE, 2, ep), _calibration(QWEN3, 4, ep)
    assert replace(probe, shard_lender=None) == qwen3
    assert probe.floor_counts == (6, 12)  # Qwen3's own layer counts on H200, not the lent floor
    assert probe.shard_lender == (f"qwen3-235b-a22b-fp8's profiles at TP 4 x EP {ep}: the same per-GPU shard (16 query / "
                                  f"1 KV heads of 128, {128 // ep} of 128 experts (top-8, intermediate 1536), hidden 4096, fp8)")
    assert "no profile measured this model's own layer" in (probe.shard_note() or "")


def test_the_cost_model_of_the_probes_server_takes_qwen3s_split_and_names_it() -> None:
    server = dict(tp=2, ep=2, attention_backend="fa3", load_format="dummy", context_length=8192)
    probe, qwen3 = build_cost_model(PROBE, "H200", "fp8", **server), build_cost_model(QWEN3, "H200", "fp8", tp=4, ep=4)
    assert probe.calibration is not None and qwen3.calibration is not None
    assert (probe.calibration.graph_step_s, probe.calibration.graph_layer_s) == \
        (qwen3.calibration.graph_step_s, qwen3.calibration.graph_layer_s)
    assert "TP 4 x EP 2" in (probe.calibration.shard_lender or "")


@pytest.mark.parametrize("other", [
    replace(PROBE, num_key_value_heads=4),  # 32 / 4 heads: 16 query / 2 KV heads a GPU at TP 2
    replace(PROBE, head_dim=64),
    replace(PROBE, hidden_size=2048),
    replace(PROBE, n_routed_experts=64),
])
def test_a_layer_whose_shard_differs_gets_no_other_models_profile(other) -> None:
    cal = _calibration(other, 2, 2)
    lent = _calibration(replace(PROBE, hidden_size=1), 2, 2)  # no model has this shard: the GPU's lent floor
    assert cal.shard_lender is None and cal.floor_counts == ()
    assert (cal.graph_step_s, cal.graph_layer_s) == (lent.graph_step_s, lent.graph_layer_s)


def test_plan_says_which_profile_priced_the_layer_and_why(tmp_path) -> None:
    """The 2026 preset with the probe's 32 / 2-head layer (model.path) and its decode at TP 2 x EP 2: `plan`'s source
    line names Qwen3's profiles, the layout that gives the same shard, and the shard."""
    from orchestrator.config import load_config
    from orchestrator.plan.closedloop.predict import calibration_sources

    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 4096, "num_hidden_layers": 40, "intermediate_size": 12288, "moe_intermediate_size": 1536,
        "num_experts": 128, "num_experts_per_tok": 8, "num_attention_heads": 32, "num_key_value_heads": 2,
        "head_dim": 128, "vocab_size": 151936}))
    cfg = load_config("configs/qwen3-pd-2026.yaml", [
        "model.preset=null", f"model.path={tmp_path}", "layout.decode.0.tp=2", "layout.decode.0.ep=2"])
    decode = next(line for line in calibration_sources(cfg, "H200") if line.startswith("layout.decode.0"))
    assert "priced by qwen3-235b-a22b-fp8's profiles at TP 4 x EP 2: the same per-GPU shard (16 query / 1 KV heads" in decode
    assert "from the lending model's layer counts 6, 12" in decode


def test_an_exact_model_match_wins_over_a_shard_match() -> None:
    """The probe's own layer-count profiles (here Qwen3's H200 counts relabelled to 32 / 2 heads, their steps 20 % longer)
    price it, not Qwen3's at the same shard."""
    counts = [p for p in SHIPPED if p.purpose == "layer-count" and p.model.matches(QWEN3, "fp8") and p.gpu.name == "H200"]
    own = [p.model_copy(update={
        "name": p.name + "-32-2-heads", "model": p.model.model_copy(update={"num_attention_heads": 32}),
        "decode": [x.model_copy(update={"step_s": 1.2 * x.step_s}) for x in p.decode]}) for p in counts]
    pool = [*SHIPPED, *own]
    probe, qwen3 = _calibration(PROBE, 2, 2, pool), _calibration(QWEN3, 4, 2, pool)
    assert probe.shard_lender is None and probe.floor_counts == (6, 12)
    assert probe.graph_layer_s != pytest.approx(qwen3.graph_layer_s, rel=0.02)
