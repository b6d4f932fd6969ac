"""Warm decode-graph capture at another layer count than the profile's: lease 22's measured law for the R1-shaped FP8
layer (a size's capture = the profile's x (f + (1 - f) L / L_profile)), shipped as the read's warm starts and applied
through the start-up fit (calibration_lookup.with_capture_law); every other shape keeps per size x layer and says so."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import capture_layer_repeats as rep
from orchestrator.cli import main
from orchestrator.config.model_presets import MODEL_PRESETS
from orchestrator.perfmodel.costmodel import build_cost_model
from orchestrator.perfmodel.profile import CaptureLayerLaw, ProfileError, shipped_capture_laws

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "benchmarks/results/2026-11-27-lease22-h200"
ARCHIVES = [RAW / "call3-probe/layer-probe.tar.xz", RAW / "call4-probe/layer-probe.tar.xz"]
LAW = ROOT / "orchestrator/perfmodel/profiles/capture/h200-r1-shaped-fp8-lease22.json"
R1 = MODEL_PRESETS["DeepSeek-R1"]
PROBE = {"attention_backend": "triton", "context_length": 16384, "page_size": 1}  # the probe's server (36 sizes)


def _raws() -> list[Path]:
    return sorted(RAW.glob("call*-probe/calibration-*.json"))


def _measured_warm() -> dict[int, list[float]]:
    """Each count's warm capture per size, as lease 22's read keeps them from the committed raw."""
    warm: dict[int, list[float]] = {}
    for r in rep.starts(_raws(), ARCHIVES):
        if r["class"] == "warm":
            warm.setdefault(r["layers"], []).append(r["capture_s"] / r["sizes"])
    return warm


def _warm_capture_s(gpu: str, layers: int, arch=R1, quantization: str = "fp8", sizes: int = 36) -> float:
    model = build_cost_model(replace(arch, num_hidden_layers=layers), gpu, quantization, calibrated=True,
                             load_format="dummy", **PROBE)
    return model.startup_breakdown_s(jit_cached=True, graph_sizes=sizes)["cuda_graphs"]


def test_the_shipped_law_is_the_reads_warm_starts_of_the_committed_raw() -> None:
    shipped = json.loads(LAW.read_text())
    from_raw = rep.capture_law(_raws(), ARCHIVES, shipped["command"])
    assert sorted((s["layers"], s["capture_s"]) for s in shipped["warm_starts"]) == sorted(
        (s["layers"], s["capture_s"]) for s in from_raw["warm_starts"])
    assert shipped["model"] == from_raw["model"]
    law = next(x for x in shipped_capture_laws() if x.read == rep.READ)
    a, b = rep.line([(float(n), c) for n, cs in _measured_warm().items() for c in cs])
    assert law.fixed_share(6) == pytest.approx(rep.share_fixed(a, b))
    assert f"f = a / (a + 6 b) = {law.fixed_share(6):.2f}," in (ROOT / rep.READ / "output.txt").read_text()


@pytest.mark.parametrize("gpu", ["H200", "H100-SXM"])
def test_priced_capture_at_4_8_12_layers_takes_lease22s_form_within_its_bootstrap_band(gpu: str) -> None:
    """The rule keeps the profile's level at its 6 layers (the lease gives the form, not the level: another host); the
    priced capture at L over the priced at 6 lies in the form the read's 90 % bootstrap interval of f allows at each
    measured count. Per size x layer (L / 6) lies outside it at every count."""
    warm = _measured_warm()
    low_f, high_f = rep.f_interval(warm)
    at_profile = _warm_capture_s(gpu, 6)
    outside_linear = []
    for layers in sorted(warm):
        band = sorted(f + (1 - f) * layers / 6 for f in (low_f, high_f))
        assert band[0] <= _warm_capture_s(gpu, layers) / at_profile <= band[1], (layers, band)
        outside_linear += [layers] if not band[0] <= layers / 6 <= band[1] else []
    assert outside_linear == [4, 8, 12]


def test_the_profiles_own_layer_count_and_r1s_61_layers() -> None:
    """At the profile's 6 layers nothing moves (the back-test's R1-shaped start-ups); R1 at 61 layers and 52 sizes
    (TP 8): 84 s of warm capture where per size x layer priced 145 s (lease 22's read: 83.8 s at f rounded to 0.47)."""
    model = build_cost_model(replace(R1, num_hidden_layers=6), "H100-SXM", "fp8", calibrated=True, load_format="dummy", **PROBE)
    st = model.calibration.startup
    assert _warm_capture_s("H100-SXM", 6) == pytest.approx(36 * 6 * st.graph_bs_layer_s)
    for gpu in ("H100-SXM", "H200"):
        r1 = _warm_capture_s(gpu, 61, sizes=52)
        assert r1 == pytest.approx(52 * st.graph_bs_layer_s * (0.467 * 6 + 0.533 * 61), rel=2e-3)
        assert 83 < r1 < 85 < 145 < 52 * 61 * st.graph_bs_layer_s < 146


def test_other_shapes_and_formats_keep_per_size_x_layer_and_say_it_is_extrapolated() -> None:
    w4a8 = build_cost_model(R1, "H100-SXM", "w4a8", calibrated=True, load_format="dummy", **PROBE)
    st = w4a8.calibration.startup
    assert st.graph_fixed_share is None
    sizes = len(w4a8.graph_batch_sizes())
    assert w4a8.startup_breakdown_s(jit_cached=True)["cuda_graphs"] == pytest.approx(sizes * 61 * st.graph_bs_layer_s)
    assert "per size x layer, extrapolated" in (w4a8.capture_layers_note() or "")
    qwen3 = build_cost_model(MODEL_PRESETS["qwen3-235b-a22b-fp8"], "H200", "fp8", calibrated=True, load_format="dummy")
    assert "at 94 layers" in (qwen3.capture_layers_note() or "") and "extrapolated" in qwen3.capture_layers_note()
    v2lite = build_cost_model(MODEL_PRESETS["DeepSeek-V2-Lite"], "H200", "bf16", calibrated=True, load_format="dummy")
    assert v2lite.calibration.startup.graph_fixed_share is None and v2lite.capture_layers_note() is None  # its own 27


def test_plan_says_which_rule_priced_the_capture(capsys) -> None:
    r1 = ["plan", "--config", str(ROOT / "configs/h200-1p1d-tp8.yaml"), "--synthetic", "--set", "benchmark.num_prompts=16"]
    main(r1)
    out = capsys.readouterr().out
    assert ("layout.decode.0: decode-graph capture at 61 layers from a figure measured at 6: per size x (0.47 + 0.53 x "
            "L / 6), the warm capture law of this layer shape (benchmarks/results/2026-11-27-lease22-read/, FP8 on H200; "
            "61 is past its 4-12 layers: extrapolated along its line)") in out
    assert "layout.prefill.0: decode-graph capture" not in out  # a PD prefill captures no decode graphs
    main(["plan", "--config", str(ROOT / "configs/default.yaml"), "--synthetic", "--set", "benchmark.num_prompts=16"])
    assert "layout.decode.0: decode-graph capture at 61 layers from a figure measured at 6: per size x layer, extrapolated" \
        in capsys.readouterr().out


def test_a_law_with_one_layer_count_is_refused_naming_the_field(tmp_path) -> None:
    shipped = json.loads(LAW.read_text())
    shipped["warm_starts"] = [s for s in shipped["warm_starts"] if s["layers"] == 4]
    (tmp_path / "one.json").write_text(json.dumps(shipped))
    with pytest.raises(ProfileError, match="one.json: warm_starts: Value error, a line needs starts at two or more layer counts"):
        shipped_capture_laws(tmp_path)
    assert CaptureLayerLaw.model_validate(json.loads(LAW.read_text())).counts() == (4, 12)
