"""A shipped routing curve (profiles/routing/: a probe's distinct-expert counts for a layer shape without a step
profile) decides what a dummy-weight decode step of that shape reads, whatever its router; real weights and shapes
never counted keep the uniform formula (the rule recorded in docs/fidelity.md before the Qwen3 probe ran)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.perfmodel import calibration_lookup, costmodel
from orchestrator.perfmodel.profile import ProfileError, RoutingCurve, shipped_routing_curves

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = str(ROOT / "configs/device-h200x2-qwen3-serve.yaml")
QWEN3_SHAPE = {"name": "qwen3-235b-a22b-fp8-l6", "hidden_size": 4096, "num_hidden_layers": 6, "first_k_dense_replace": 0,
               "n_routed_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 1536,
               "num_attention_heads": 64, "kv_lora_rank": 0, "qk_rope_head_dim": 0, "quantization": "fp8"}


def _curve(points: list[tuple[int, float]]) -> RoutingCurve:
    return RoutingCurve.model_validate({
        "model": QWEN3_SHAPE, "raw": "benchmarks/results/x/", "command": "bash scripts/device/qwen3_probe.sh",
        "routing": [{"tokens": t, "distinct_experts": d, "gate": "dummy", "calls": 36} for t, d in points]})


def _decode(sets: list[str] = ()):
    cfg = load_config(QWEN3, [*sets])
    return costmodel.cost_model_for(cfg, "decode", cfg.layout.decode[0])


def _routed_fraction_read(model, tokens: int) -> float:
    w = model.weight_bytes_breakdown()
    fixed = w["attention"] + w["dense_mlp_shared"] + model.params.lm_head * model.format.embedding_bytes / model.tp
    return (model._weight_bytes_read(tokens)[0] - fixed) / w["routed_experts"]


def test_without_a_curve_a_qwen3_step_reads_the_uniform_formula(monkeypatch) -> None:
    monkeypatch.setattr(calibration_lookup, "_routing_curves", lambda: ())
    assert _routed_fraction_read(_decode(), 16) == pytest.approx(1 - (1 - 8 / 128) ** 16)


def test_a_measured_dummy_curve_decides_the_dummy_step_and_real_weights_stay_uniform(monkeypatch) -> None:
    monkeypatch.setattr(calibration_lookup, "_routing_curves", lambda: (_curve([(1, 8.0), (64, 9.0), (512, 12.0)]),))
    dummy = _decode()
    assert _routed_fraction_read(dummy, 64) == pytest.approx(9.0 / 128)
    assert _routed_fraction_read(dummy, 1024) == pytest.approx(12.0 / 128)   # flat past the last measured batch
    real = _decode(["engine.sglang.load_format=null"])
    assert _routed_fraction_read(real, 64) == pytest.approx(1 - (1 - 8 / 128) ** 64)
    assert dummy.decode_step_s(64, 64 * 4100) < real.decode_step_s(64, 64 * 4100)


def test_a_curve_of_another_shape_changes_nothing(monkeypatch) -> None:
    other = _curve([(1, 8.0), (64, 9.0)])
    other = other.model_copy(update={"model": other.model.model_copy(update={"moe_intermediate_size": 2048})})
    monkeypatch.setattr(calibration_lookup, "_routing_curves", lambda: (other,))
    assert _routed_fraction_read(_decode(), 64) == pytest.approx(1 - (1 - 8 / 128) ** 64)


def test_a_bad_curve_file_is_refused_naming_the_file(tmp_path) -> None:
    (tmp_path / "qwen3.json").write_text(json.dumps({"model": QWEN3_SHAPE, "raw": "x", "command": "y", "routing": []}))
    with pytest.raises(ProfileError, match="qwen3.json: not a routing curve"):
        shipped_routing_curves(tmp_path)
    assert shipped_routing_curves(tmp_path / "none") == []
