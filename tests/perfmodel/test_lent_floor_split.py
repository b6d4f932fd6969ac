"""The layer-count split per layer shape (issue 25, lease 11): R1's split reads R1's counts only, so Qwen3's counts leave
it byte for byte; a shape no profile calibrates (Qwen3: the roofline plus the GPU's lent floor) measured at two layer
counts on one host takes its own floor on that GPU (lent_floor_split, F(L) read as the probe registered it: lease 11 on
H200, lease 12 on H100); a GPU with no count of its own keeps the lent floor. Synthetic counts here: steps built as the model's own non-fixed part +
a + b x layers, so the split is known."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.config.model_presets import DEEPSEEK_R1, MODEL_PRESETS
from orchestrator.perfmodel.calibration_lookup import find_calibration, graphed_step_floor, layer_count_split
from orchestrator.perfmodel.profile import CalibrationProfile, DecodePoint, shipped_profiles
from orchestrator.perfmodel.gpus import gpu_spec
from orchestrator.perfmodel.server.engine_cost_model import EngineCostModel

QWEN3 = MODEL_PRESETS["qwen3-235b-a22b-fp8"]
SHIPPED = shipped_profiles()
QWEN3_COUNTS = [p for p in SHIPPED if p.purpose == "layer-count" and p.model.matches(QWEN3, "fp8")]
WITHOUT_QWEN3_COUNTS = [p for p in SHIPPED if p not in QWEN3_COUNTS]
A_S, B_S = 0.35e-3, 95e-6


def test_qwen3s_counts_leave_r1s_split_and_r1s_calibrations_unchanged() -> None:
    assert sorted((p.gpu.name, p.model.num_hidden_layers) for p in QWEN3_COUNTS) == \
        [("H100-SXM", 6), ("H100-SXM", 12), ("H200", 6), ("H200", 12)]
    for gpu in ("H100-SXM", "H200"):
        assert layer_count_split(gpu, SHIPPED, DEEPSEEK_R1, "fp8") == layer_count_split(gpu, WITHOUT_QWEN3_COUNTS, DEEPSEEK_R1, "fp8")
        for quantization in ("fp8", "w4a8"):
            assert find_calibration(gpu, DEEPSEEK_R1, quantization, SHIPPED) == \
                find_calibration(gpu, DEEPSEEK_R1, quantization, WITHOUT_QWEN3_COUNTS)
    assert layer_count_split("H200", SHIPPED, QWEN3, "fp8") is not None  # Qwen3's own counts, read apart


def test_the_qwen3_shaped_layer_on_h200_takes_lease_11s_measured_split() -> None:
    """Lease 11's two counts on one H200 host -> 0.259 ms per step + 109.6 us per layer (F(6) = 0.953, F(12) = 1.632 ms,
    0.275 + 113.1, as read before the Triton GQA latency entered the model's non-fixed part: docs/fidelity.md, Lease 11
    and "The Triton GQA decode attention's context latency"), for its graphed steps and its roofline forwards."""
    cal = find_calibration("H200", QWEN3, "fp8", SHIPPED)
    assert cal is not None
    assert round(cal.graph_step_s * 1e3, 3) == 0.259 and round(cal.graph_layer_s * 1e6, 1) == 109.6  # type: ignore[operator]
    assert (cal.floor_step_s, cal.floor_layer_s) == (cal.graph_step_s, cal.graph_layer_s)
    lent = find_calibration("H200", QWEN3, "fp8", WITHOUT_QWEN3_COUNTS)
    assert lent is not None and lent.floor_step_s is None
    assert cal.floor_counts == (6, 12) and lent.floor_counts == ()
    assert replace(cal, graph_step_s=lent.graph_step_s, graph_layer_s=lent.graph_layer_s, floor_step_s=None,
                   floor_layer_s=None, floor_counts=()) == lent  # nothing else moves


def test_the_qwen3_shaped_layer_on_h100_takes_lease_12s_measured_split() -> None:
    """Lease 12's two counts on one H100 host -> 0.041 ms per step + 98.2 us per layer (F(6) = 0.649, F(12) = 1.257 ms,
    0.041 + 101.3 before the Triton GQA latency: benchmarks/results/2026-11-27-lease12-read/): its own host's counts,
    not the H200's."""
    cal = find_calibration("H100-SXM", QWEN3, "fp8", SHIPPED)
    assert cal is not None
    assert round(cal.graph_step_s * 1e3, 3) == 0.041 and round(cal.graph_layer_s * 1e6, 1) == 98.2  # type: ignore[operator]
    assert (cal.floor_step_s, cal.floor_layer_s) == (cal.graph_step_s, cal.graph_layer_s)


def test_a_gpu_without_its_own_counts_keeps_the_lent_floor() -> None:
    h200_counts_only = [p for p in SHIPPED if p not in QWEN3_COUNTS or p.gpu.name == "H200"]
    h100 = find_calibration("H100-SXM", QWEN3, "fp8", h200_counts_only)
    lent = graphed_step_floor("H100-SXM", [p for p in SHIPPED if p.purpose == "calibration"])
    assert h100 is not None and lent is not None
    assert (h100.graph_step_s, h100.graph_layer_s) == lent and h100.floor_step_s is None
    assert h100 == find_calibration("H100-SXM", QWEN3, "fp8", WITHOUT_QWEN3_COUNTS)


def _synthetic(layers: int, gpu: str = "H200", per_layer_s: float = B_S) -> CalibrationProfile:
    """A Qwen3-shaped count whose steps are the model's non-fixed part at the lent floor + A_S + per_layer_s x layers."""
    lent = find_calibration(gpu, QWEN3, "fp8", WITHOUT_QWEN3_COUNTS)
    assert lent is not None and lent.graph_step_s is not None and lent.graph_layer_s is not None
    base = next(p for p in QWEN3_COUNTS if p.gpu.name == "H200")
    e = base.engine
    at = EngineCostModel(arch=replace(QWEN3, num_hidden_layers=layers), gpu=gpu_spec(gpu), quantization="fp8",
                         calibration=lent, attention_backend=e.attention_backend, context_length=e.context_length,
                         page_size=e.page_size, load_format="dummy")
    floor = lent.graph_step_s + layers * lent.graph_layer_s
    points = [DecodePoint(batch_size=b, context_tokens=b * 306, cuda_graph=True, steps=40,
                          step_s=at.decode_step_s(b, b * 306) - floor + A_S + per_layer_s * layers) for b in (1, 8, 32, 64)]
    return base.model_copy(update={
        "name": f"{gpu.lower()}-q3l{layers}-synthetic", "decode": points,
        "gpu": base.gpu.model_copy(update={"name": gpu}), "model": base.model.model_copy(update={"num_hidden_layers": layers})})


def test_the_split_is_the_line_through_each_counts_fixed_time_whatever_the_slope() -> None:
    for slope in (B_S, 300e-6):  # above R1's 139.5 us too: applied per shape, whatever b is
        pool = [*WITHOUT_QWEN3_COUNTS, _synthetic(3, per_layer_s=slope), _synthetic(9, per_layer_s=slope)]
        cal = find_calibration("H200", QWEN3, "fp8", pool)
        assert cal is not None
        assert cal.graph_step_s == pytest.approx(A_S, rel=1e-6) and cal.graph_layer_s == pytest.approx(slope, rel=1e-6)


def test_one_count_or_another_hosts_counts_split_nothing() -> None:
    lent_h200 = find_calibration("H200", QWEN3, "fp8", WITHOUT_QWEN3_COUNTS)
    assert find_calibration("H200", QWEN3, "fp8", [*WITHOUT_QWEN3_COUNTS, _synthetic(6)]) == lent_h200
    h200_counts = [p for p in QWEN3_COUNTS if p.gpu.name == "H200"]
    h100_one = [*WITHOUT_QWEN3_COUNTS, *h200_counts, _synthetic(6, "H100-SXM")]  # one H100 count: no split, no pooling
    assert find_calibration("H100-SXM", QWEN3, "fp8", h100_one) == find_calibration("H100-SXM", QWEN3, "fp8", WITHOUT_QWEN3_COUNTS)


def test_plan_names_where_the_qwen3_floor_comes_from() -> None:
    """`plan`'s source line says the floor is this shape's own layer counts where they split it, not other shapes'."""
    from orchestrator.config import load_config
    from orchestrator.plan.closedloop.predict import calibration_sources

    cfg = load_config("configs/qwen3-pd-2026.yaml")
    decode = next(line for line in calibration_sources(cfg, "H100-SXM") if line.startswith("layout.decode.0"))
    assert "0.04 ms per step + 98 us per layer, from this shape's own layer counts 6, 12 on this GPU's host" in decode
    assert "other shapes" not in decode
