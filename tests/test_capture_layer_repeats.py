"""Lease 22's read: the start right after a cold one is its own class, and the registered rule's outcome."""

from __future__ import annotations

from pathlib import Path

from benchmarks import capture_layer_repeats as rep

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "benchmarks/results/2026-11-27-lease22-h200"
ARCHIVES = [RAW / "call3-probe/layer-probe.tar.xz", RAW / "call4-probe/layer-probe.tar.xz"]


def test_the_start_after_the_cold_one_is_its_own_class_and_only_in_its_call() -> None:
    cls = rep.classes(ARCHIVES)
    assert cls["server-r1s4-lease22-start1.log"] == "cold"
    assert cls["server-r1s4-lease22-start2.log"] == "after-cold"
    assert cls["server-r1s4-lease22-start3.log"] == "warm"
    assert cls["server-r1s12-lease22c4-start1.log"] == "warm"  # call 4 began on warm caches
    assert sorted(cls.values()).count("after-cold") == 1


def test_the_read_of_the_committed_raw_resolves_affine(capsys) -> None:
    raws = sorted(RAW.glob("call*-probe/calibration-*.json"))
    predicted = ROOT / "benchmarks/results/2026-11-27-lease22-predicted/predicted.json"
    assert rep.read(raws, ARCHIVES, predicted) == 0
    out = capsys.readouterr().out
    assert "f = a / (a + 6 b) = 0.47" in out
    assert "resolved (affine)" in out


def test_too_few_warm_starts_at_an_extreme_count_is_not_resolved(capsys) -> None:
    raws = [RAW / "call3-probe/calibration-r1s4-lease22.json", RAW / "call3-probe/calibration-r1s12-lease22.json"]
    assert rep.read(raws, ARCHIVES[:1], None) == 0
    assert "not resolved" in capsys.readouterr().out
