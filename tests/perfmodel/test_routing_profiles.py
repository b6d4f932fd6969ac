"""Dummy weights and real weights take the decode curve measured with their routing: the H200 R1-shaped probe's
dummy-weight run (every token to ~8-10 experts) and its randomised-gate run (uniform routing, as a real checkpoint)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.config.model_presets import DEEPSEEK_R1
from orchestrator.perfmodel.calibration_lookup import find_calibration
from orchestrator.perfmodel.costmodel import build_cost_model
from orchestrator.perfmodel.profile import shipped_profiles

R1S6 = replace(DEEPSEEK_R1, num_hidden_layers=6, first_k_dense_replace=3)


def probe_server(load_format: str):
    # the probe's own server: one H200, 6 R1-shaped layers, triton, graphs to 512
    return build_cost_model(R1S6, "H200", "fp8", tp=1, attention_backend="triton", load_format=load_format,
                            mem_fraction_static=0.7, cuda_graph_max_bs=512, context_length=16384)


def test_each_load_format_takes_the_profile_measured_with_its_routing() -> None:
    assert find_calibration("H200", DEEPSEEK_R1, "fp8", load_format="dummy").profile == "h200-r1s6-sglang0.5.17"
    for real in ("auto", None, "safetensors"):
        assert find_calibration("H200", DEEPSEEK_R1, "fp8", load_format=real).profile == "h200-r1s6-random-gates-sglang0.5.17"
    # no randomised-gate profile on H100: both load formats use its dummy-weight profile (real: uniform routing reads)
    assert {find_calibration("H100-SXM", DEEPSEEK_R1, "fp8", load_format=f).profile for f in ("dummy", "auto")} == {
        "h100-sxm-r1s6-sglang0.5.17"}


@pytest.mark.parametrize("batch, dummy_ms, random_ms", [(32, 3.11, 7.91), (128, 5.39, 12.88), (512, 16.61, 23.68)])
def test_the_probe_s_two_decode_curves_are_reproduced(batch: int, dummy_ms: float, random_ms: float) -> None:
    # measured (benchmarks/results/2026-11-26-dummy-routing-h200/README.md), context 256 per request + 50 decoded
    context = batch * 306
    dummy, real = probe_server("dummy"), probe_server("auto")
    assert dummy.decode_step_s(batch, context) * 1e3 == pytest.approx(dummy_ms, rel=0.2)
    assert real.decode_step_s(batch, context) * 1e3 == pytest.approx(random_ms, rel=0.2)


def test_the_randomised_gate_profile_is_fitted_under_uniform_routing() -> None:
    profile = next(p for p in shipped_profiles() if p.model.routing == "random-gates")
    assert profile.model.real_like and profile.raw.startswith("benchmarks/results/2026-11-26-dummy-routing-h200")
    assert {r.gate for r in profile.routing} == {"random"}
    cal = find_calibration("H200", DEEPSEEK_R1, "fp8", load_format="auto")
    assert cal.decode is not None and cal.decode.graph_rms_rel < 0.15
    # its prefill shares are lent by this GPU's other profile of the shape (its own log did not come back)
    assert cal.efficiency_prefill == find_calibration("H200", DEEPSEEK_R1, "fp8", load_format="dummy").efficiency_prefill


def test_a_profile_without_a_routing_measurement_names_the_one_whose_curve_it_carries() -> None:
    h100 = find_calibration("H100-SXM", DEEPSEEK_R1, "fp8", load_format="dummy")
    h200 = find_calibration("H200", DEEPSEEK_R1, "fp8", load_format="dummy")
    assert h100.dummy_routing == h200.dummy_routing and h100.routing_lender == h200.profile == "h200-r1s6-sglang0.5.17"
    assert "h200-r1s6-sglang0.5.17" in h100.routing_note("dummy") and h200.routing_note("dummy") is None
    assert h100.routing_note("auto") is None  # a real checkpoint's reads take uniform routing: nothing borrowed is used


def test_a_config_decodes_on_the_dummy_curve_by_default_and_on_the_uniform_one_with_real_weights() -> None:
    """As `plan` builds a server from a config: the schema's default load format (dummy, the contest's) takes the
    dummy-routing profile and decodes faster than the same server with real weights (--load-format null), which takes
    the randomised-gate one; a TP 8 decode server of FP8 R1 on one 8 x H200 node."""
    from pathlib import Path

    from orchestrator.config import load_config
    from orchestrator.config.schema import SglangEngineConfig
    from orchestrator.perfmodel.costmodel import cost_model_for

    assert SglangEngineConfig.model_fields["load_format"].default == "dummy"
    preset = Path(__file__).resolve().parents[2] / "configs/h200-1p1d-tp8.yaml"
    servers = {}
    for name, sets in (("dummy", []), ("real", ["engine.sglang.load_format=null"])):
        cfg = load_config(preset, sets)
        servers[name] = cost_model_for(cfg, "decode", cfg.layout.decode[0])
    assert servers["dummy"].calibration.profile == "h200-r1s6-sglang0.5.17"
    assert servers["real"].calibration.profile == "h200-r1s6-random-gates-sglang0.5.17"
    for batch in (8, 64, 256):
        dummy, real = (servers[n].decode_step_s(batch, batch * 1000) for n in ("dummy", "real"))
        assert dummy < 0.9 * real, (batch, dummy, real)
