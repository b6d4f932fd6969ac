"""The weight-load and KV-allocation terms of a start-up (GpuSpec.dummy_init_gb_s, kv_alloc_s, a profile's
StartupCoeffs.kv_alloc_s) are what the committed dummy-weight starts' logs measured."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.startup_capture_by_shape import weight_and_kv_starts
from orchestrator.perfmodel.calibration_lookup import calibration_for
from orchestrator.perfmodel.gpus import GB, GIB, gpu_spec
from orchestrator.perfmodel.profile import shipped_profiles
from orchestrator.config.model_presets import MODEL_PRESETS


def test_the_dummy_init_rate_and_kv_allocation_are_the_logs_medians() -> None:
    starts = weight_and_kv_starts()
    assert len(starts) >= 100  # every start once, not the copies of a log in several archives
    rate = statistics.median(gib * GIB / GB / s for gib, s, *_ in starts if s > 0)
    kv = statistics.median(kv for *_, kv, _ in starts)
    for gpu in ("H100-SXM", "H200"):
        assert gpu_spec(gpu).dummy_init_gb_s == pytest.approx(rate, rel=0.05)
        assert gpu_spec(gpu).kv_alloc_s == pytest.approx(kv, abs=0.01)
        assert gpu_spec(gpu).kv_alloc_s <= max(kv for *_, kv, _ in starts)


def test_a_profile_prices_kv_allocation_at_its_own_measured_median() -> None:
    for profile in (p for p in shipped_profiles() if p.startup and p.purpose == "calibration"):
        arch = next(a for a in MODEL_PRESETS.values() if profile.model.matches(a, profile.model.quantization))
        measured = [r.kv_alloc_s for r in profile.startup if r.kv_alloc_s is not None]
        assert measured, profile.name
        startup = calibration_for(profile, arch, profile.model.quantization).startup
        assert startup.kv_alloc_s == pytest.approx(statistics.median(measured)) and startup.kv_alloc_s < 0.1
