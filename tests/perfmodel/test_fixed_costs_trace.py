"""The roofline's fixed costs and read shares trace to the shipped calibration profiles (issue 25: every mechanism
parameter traces to a calibration file or a cited source). Each GPU's per-step and per-layer fixed cost is the
CUDA-graphed decode floor that calibration_lookup.graphed_step_floor splits from the shipped one-GPU profiles (whose numbers
tests/perfmodel/test_profiles_trace_to_raw.py holds to their raw files); the routed experts' read share is
calibration_lookup.expert_stream_share of the dummy / randomised-gate pair; the other reads go at the rate that floor was
split against; a TP layer across nodes adds what a cited public single-stream TP16 step takes beyond the rest.
A GPU figure edited by hand, or a profile that moves the floor, fails here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.config.schema import SimEngineConfig
from orchestrator.perfmodel.calibration_lookup import expert_stream_share, graphed_step_floor, shape_step_floor
from orchestrator.perfmodel.costmodel import build_cost_model
from orchestrator.perfmodel.gpus import GPU_SPECS
from orchestrator.perfmodel.parallel import collectives
from orchestrator.config.model_presets import MODEL_PRESETS
from orchestrator.perfmodel.profile import shipped_profiles
from orchestrator.perfmodel.server.forward import WEIGHT_READ_EFFICIENCY

MEASURED_GPUS = ("H100-SXM", "H200")


@pytest.mark.parametrize("gpu", MEASURED_GPUS)
def test_each_gpus_fixed_costs_are_its_measured_graphed_floor(gpu):
    floor = graphed_step_floor(gpu, shipped_profiles())
    assert floor is not None, f"no two layer counts measured on {gpu}'s die"
    step_s, layer_s = floor
    spec = GPU_SPECS[gpu]
    assert spec.step_overhead_s == pytest.approx(step_s, rel=0.005)
    assert spec.layer_overhead_s == pytest.approx(layer_s, rel=0.005)


@pytest.mark.parametrize("gpu", MEASURED_GPUS)
def test_each_gpus_routed_read_share_is_the_measured_expert_stream_share(gpu):
    share = expert_stream_share(gpu, shipped_profiles())
    assert share is not None
    assert GPU_SPECS[gpu].routed_read_share == pytest.approx(share, rel=0.005)


def test_reads_default_to_the_rate_the_floor_was_split_against():
    """The floor is what is left of each graphed step after its reads at WEIGHT_READ_EFFICIENCY, so the roofline
    that adds the floor reads at that rate by default (config, simulator and cost model alike)."""
    assert SimEngineConfig().efficiency_decode == WEIGHT_READ_EFFICIENCY
    assert build_cost_model(MODEL_PRESETS["DeepSeek-R1"], "H100-SXM", "fp8", calibrated=False).efficiency_decode == WEIGHT_READ_EFFICIENCY


def test_a_cross_node_step_is_reads_collectives_and_the_measured_floor():
    """A TP16 step across two nodes (no calibrated per-GPU terms there): non-expert and KV reads at the split rate,
    the routed experts at their kernel's share, the all-reduces with the cited cross-node layer cost, and the R1-shaped
    layer's measured floor on H100 for 61 layers."""
    m = build_cost_model(MODEL_PRESETS["DeepSeek-R1"], "H100-SXM", "fp8", calibrated=True, tp=16, nnodes=2)
    assert m._tp_spans_nodes
    bs, ctx = 64, 64 * 800
    hbm = m.gpu.hbm_tb_s * 1e12
    weights, routed = m._weight_bytes_read(bs)
    reads = (weights - routed + ctx * m.kv_bytes_per_gpu_token()) / (hbm * WEIGHT_READ_EFFICIENCY) + routed / (hbm * GPU_SPECS["H100-SXM"].routed_read_share)
    # the R1-shaped layer's own floor (measured at 4, 5, 6 layers, lease 8), not the GPU's cross-shape one
    own = shape_step_floor("H100-SXM", shipped_profiles(), MODEL_PRESETS["DeepSeek-R1"], "fp8")
    assert own is not None and own != (GPU_SPECS["H100-SXM"].step_overhead_s, GPU_SPECS["H100-SXM"].layer_overhead_s)
    floor = own[0] + 61 * own[1]
    comm = 122 * collectives.allreduce_s(bs * 7168 * 2, 16, 2, collectives.HOPPER) + 61 * collectives.HOPPER.inter_tp_layer_s
    expected = (reads + comm + floor) / m.attention_speed
    assert m.decode_step_s(bs, ctx) == pytest.approx(expected, rel=1e-6)


# tenstorrent/tt-inference-server issue 356 (2025-07-09): DeepSeek-R1-0528 on 16 H100 over InfiniBand with SGLang,
# concurrency 1, ISL 128 / OSL 128: TPOT 23.1 ms (a public figure, not a back-test row)
PUBLIC_TP16_SINGLE_STREAM_TPOT_S = 23.1e-3


def test_the_cross_node_tp_layer_cost_is_the_cited_single_stream_tpot_beyond_the_rest_of_the_model(monkeypatch):
    """collectives.HOPPER.inter_tp_layer_s is what the public single-stream TP16 step takes beyond the model's own
    batch-1 step there (floor, reads, all-reduces), per layer: re-derived here, so a change to any of those terms that
    leaves the constant stale fails."""
    cited = collectives.HOPPER.inter_tp_layer_s
    monkeypatch.setitem(collectives.PUBLISHED, "H100-SXM", replace(collectives.HOPPER, inter_tp_layer_s=None))
    m = build_cost_model(MODEL_PRESETS["DeepSeek-R1"], "H100-SXM", "fp8", calibrated=True, tp=16, nnodes=2, load_format="auto")
    without = m.decode_step_s(1, 128 + 64)  # one request, mid-way through its 128 output tokens
    assert cited == pytest.approx((PUBLIC_TP16_SINGLE_STREAM_TPOT_S - without) / 61, rel=0.01)
    monkeypatch.undo()
    assert m.decode_step_s(1, 128 + 64) == pytest.approx(PUBLIC_TP16_SINGLE_STREAM_TPOT_S, rel=0.01)


@pytest.mark.parametrize("gpu", MEASURED_GPUS)
def test_a_shape_measured_in_another_format_decodes_on_that_profiles_fixed_time_per_layer(gpu):
    """R1 W4A8 (no profile of its format): its graphed decode steps take the FP8 R1 profile's fixed time (per step and per
    layer, as the layer-count split leaves it), the time the calibrated FP8 steps charge, so the two formats differ by
    their reads, not by their fixed costs."""
    r1 = MODEL_PRESETS["DeepSeek-R1"]
    fp8 = build_cost_model(r1, gpu, "fp8", calibrated=True, tp=8)
    w4a8 = build_cost_model(r1, gpu, "w4a8", calibrated=True, tp=8)
    assert w4a8.calibration is not None and fp8.calibration is not None and fp8.calibration.decode is not None
    assert w4a8.calibration.graph_step_s == pytest.approx(fp8.calibration.decode_step_s)  # the layer-count split's
    assert w4a8.calibration.graph_layer_s == pytest.approx(fp8.calibration.decode.layer_s)
    assert w4a8.decode_step_s(1, 1000) < fp8.decode_step_s(1, 1000) < 1.2 * w4a8.decode_step_s(1, 1000)
