"""A graphed decode step's fixed time, split by layer count (issue 25, lease 8): profiles of one layer shape measured at
several layer counts on one host (purpose "layer-count") give the per-layer part as the slope of each count's fixed time;
both 61-layer paths take it: the calibrated path keeps its profile's fixed time at the profile's own layer count and adds
or drops that slope per layer, the roofline's floor takes the slope and each GPU's own per-step part. A layer-count
profile never calibrates a server. Synthetic profiles here: steps built as reads + a + b x layers + per-request terms,
so the split is known."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.config.model_presets import DEEPSEEK_R1, MODEL_PRESETS
from orchestrator.perfmodel.calibration_lookup import (
    calibration_for,
    find_calibration,
    graphed_step_floor,
    layer_count_split,
    shape_step_floor,
)
from orchestrator.perfmodel.costmodel import build_cost_model
from orchestrator.perfmodel.profile import CalibrationProfile, DecodePoint, find_profile, shipped_profiles

BATCHES = (1, 8, 32, 64, 128, 256)
CALIBRATIONS = [p for p in shipped_profiles() if p.purpose == "calibration"]  # without lease 8's layer counts
PER_STEP_S, PER_LAYER_S, PER_REQUEST_LAYER_S = 0.4e-3, 90e-6, 2e-6


def _at(layers: int):
    """The server a layer-count profile's fit prices its reads on (costmodel's calibration of a profile)."""
    shape = replace(DEEPSEEK_R1, num_hidden_layers=layers, first_k_dense_replace=3)
    return build_cost_model(shape, "H100-SXM", "fp8", calibrated=False, tp=1, dp=1, dp_attention=False,
                            sglang_version="0.5.17", load_format="dummy", page_size=1, context_length=16384,
                            attention_backend="triton")


def counted(layers: int, per_layer_s: float = PER_LAYER_S) -> CalibrationProfile:
    base = next(p for p in CALIBRATIONS if p.name == "h100-sxm-r1s6-sglang0.5.17")
    at = _at(layers)
    points = [DecodePoint(batch_size=b, context_tokens=b * 306, cuda_graph=True, steps=300,
                          step_s=at.weight_read_s(b) + at._comm_s(b) + PER_STEP_S + layers * (per_layer_s + PER_REQUEST_LAYER_S * b))
              for b in BATCHES]
    return base.model_copy(update={
        "name": f"h100-r1s{layers}-layer-count", "purpose": "layer-count", "decode": points, "prefill": [], "startup": [],
        "memory": [], "model": base.model.model_copy(update={"num_hidden_layers": layers})})


def test_the_slope_of_one_hosts_layer_counts_is_the_per_layer_part() -> None:
    pool = [*CALIBRATIONS, counted(4), counted(5), counted(6)]
    split = layer_count_split("H100-SXM", pool, DEEPSEEK_R1, "fp8")
    assert split is not None
    assert split[0] == pytest.approx(PER_LAYER_S, rel=1e-3)
    assert split[1].matches(DEEPSEEK_R1, "fp8")
    # the same die (H200: Hopper's compute peaks) takes the H100's slope
    assert layer_count_split("H200", pool, DEEPSEEK_R1, "fp8")[0] == pytest.approx(PER_LAYER_S, rel=1e-3)  # type: ignore[index]


def test_one_layer_count_or_only_dense_layers_split_nothing() -> None:
    assert layer_count_split("H100-SXM", CALIBRATIONS, DEEPSEEK_R1, "fp8") is None
    assert layer_count_split("H100-SXM", [*CALIBRATIONS, counted(4)], DEEPSEEK_R1, "fp8") is None
    dense_only = counted(3, per_layer_s=10 * PER_LAYER_S)  # 3 layers = R1's 3 dense: a check, never in the slope
    split = layer_count_split("H100-SXM", [*CALIBRATIONS, counted(4), counted(6), dense_only], DEEPSEEK_R1, "fp8")
    assert split is not None and split[0] == pytest.approx(PER_LAYER_S, rel=1e-3)


def test_a_layer_count_profile_never_calibrates_a_server() -> None:
    pool = [*CALIBRATIONS, counted(4), counted(6)]
    assert find_profile("H100-SXM", DEEPSEEK_R1, "fp8", pool).name == "h100-sxm-r1s6-sglang0.5.17"  # type: ignore[union-attr]
    assert find_calibration("H100-SXM", DEEPSEEK_R1, "fp8", pool).profile == "h100-sxm-r1s6-sglang0.5.17"  # type: ignore[union-attr]


def test_the_calibrated_path_keeps_its_profiles_fixed_time_and_adds_the_slope_per_layer() -> None:
    pool = [*CALIBRATIONS, counted(4), counted(5), counted(6)]
    before = find_calibration("H100-SXM", DEEPSEEK_R1, "fp8", CALIBRATIONS)
    after = find_calibration("H100-SXM", DEEPSEEK_R1, "fp8", pool)
    assert before is not None and after is not None and before.decode is not None and after.decode is not None
    profile_fixed = before.layers * before.decode.layer_s
    assert after.decode_step_s + after.layers * after.decode.layer_s == pytest.approx(profile_fixed)  # at 6 layers
    assert after.decode_step_s + 61 * after.decode.layer_s == pytest.approx(profile_fixed + 55 * PER_LAYER_S, rel=1e-3)
    # the per-request and per-context terms stay the profile's
    assert (after.decode.layer_per_req_s, after.decode.layer_per_ctx_s) == (before.decode.layer_per_req_s, before.decode.layer_per_ctx_s)


def test_the_shapes_roofline_floor_takes_the_slope_and_each_gpus_own_per_step_part() -> None:
    pool = [*CALIBRATIONS, counted(4), counted(5), counted(6), counted(3, per_layer_s=10 * PER_LAYER_S)]
    h100 = shape_step_floor("H100-SXM", pool, DEEPSEEK_R1, "fp8")  # the dense-only count: in neither part
    assert h100 is not None and h100[1] == pytest.approx(PER_LAYER_S, rel=1e-3)
    # the H100's R1-shaped profiles: the shipped 6-layer one (0.903 ms) and the three synthetic counts (a exactly)
    old = find_calibration("H100-SXM", DEEPSEEK_R1, "fp8", CALIBRATIONS)
    assert old is not None and old.decode is not None
    expected = ((6 * old.decode.layer_s - 6 * PER_LAYER_S) + 3 * PER_STEP_S) / 4
    assert h100[0] == pytest.approx(expected, rel=1e-3)
    h200 = shape_step_floor("H200", pool, DEEPSEEK_R1, "fp8")
    assert h200 is not None and h200[1] == pytest.approx(PER_LAYER_S, rel=1e-3) and h200[0] != pytest.approx(h100[0])
    # the calibration of an R1 server carries it (its roofline forwards: a TP group across nodes, prefill)
    cal = find_calibration("H100-SXM", DEEPSEEK_R1, "fp8", pool)
    assert cal is not None and (cal.floor_step_s, cal.floor_layer_s) == pytest.approx(h100)
    # another layer shape keeps the GPU's cross-shape floor: the split says nothing about its layers
    assert graphed_step_floor("H100-SXM", pool) == graphed_step_floor("H100-SXM", CALIBRATIONS)
    v2 = find_calibration("H200", MODEL_PRESETS["DeepSeek-V2-Lite"], "bf16", pool)
    assert v2 is not None and v2.floor_step_s is None


def test_the_shipped_split_is_lease_8s_three_layer_counts_on_one_h100() -> None:
    """4, 5 and 6 R1-shaped layers on one H100 host (benchmarks/results/2026-11-27-lease8-r1-layers-h100/): fixed time
    0.787 / 0.893 / 1.066 ms per graphed step, 139.5 us per layer; the calibrated 61-layer path pays the 2026-11-24
    profile's 0.903 ms at 6 layers + 55 x 139.5 us."""
    counts = [p for p in shipped_profiles() if p.purpose == "layer-count" and p.model.matches(DEEPSEEK_R1, "fp8")]
    assert sorted(p.model.num_hidden_layers for p in counts) == [4, 5, 6]
    fits = {p.model.num_hidden_layers: calibration_for(p, DEEPSEEK_R1, "fp8").decode for p in counts}
    fixed = {n: n * fit.layer_s for n, fit in fits.items() if fit is not None}
    assert [round(fixed[n] * 1e3, 3) for n in (4, 5, 6)] == [0.787, 0.893, 1.066]
    split = layer_count_split("H100-SXM", shipped_profiles(), DEEPSEEK_R1, "fp8")
    assert split is not None and split[0] == pytest.approx(139.5e-6, rel=0.005)
    cal = find_calibration("H100-SXM", DEEPSEEK_R1, "fp8")
    assert cal is not None and cal.decode is not None and cal.profile == "h100-sxm-r1s6-sglang0.5.17"
    assert cal.decode_step_s + 61 * cal.decode.layer_s == pytest.approx(0.903e-3 + 55 * split[0], abs=2e-6)
