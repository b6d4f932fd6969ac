"""hcapdeep's registration of lease 22's capture law at 14 layers: the committed predictions are what the script
computes today, 15 layers and more do not fit one H200, and the read's outcome follows the registered band."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import capture_deep as deep

ROOT = Path(__file__).resolve().parents[1]
REGISTERED = ROOT / "benchmarks/results/2026-11-28-capture-deep-predicted/predicted.json"
LEASE22 = ROOT / "benchmarks/results/2026-11-27-lease22-h200"


def test_the_registered_predictions_are_what_the_script_computes() -> None:
    assert deep.predict() == json.loads(REGISTERED.read_text())


def test_fourteen_layers_is_the_deepest_count_that_fits_one_h200() -> None:
    rows = {m["layers"]: m for m in json.loads(REGISTERED.read_text())["memory"]}
    assert rows[14]["fits_probe"] and rows[14]["planner_fits_weights_and_kv"]
    assert not any(rows[n]["fits_probe"] or rows[n]["planner_fits_weights_and_kv"] for n in (15, 16, 20))
    # the estimate from lease 22's logs reproduces its own 12-layer KV pool (24.06 GiB logged)
    assert abs(rows[12]["sglang_kv_gib"] - 24.06) < 0.2


def test_the_verdict_is_the_registered_band_and_names_the_side_of_a_miss() -> None:
    band = [1.809, 2.346]
    assert deep.verdict(2.0, band).startswith("HOLDS")
    assert "per size x layer" in deep.verdict(2.5, band)
    assert "flat" in deep.verdict(1.5, band)


def test_the_read_classifies_starts_and_prices_the_rows_on_lease22s_raw(tmp_path, capsys) -> None:
    registered = json.loads(REGISTERED.read_text())
    # lease 22's 12 / 4 layers stand in for 14 / 4: its call 4 (warm caches) has three warm starts at each
    stand_in = {**registered, "deep": 12, "planner": {"12 warm": {"ready_s": 68.5, "cuda_graphs_s": 15.2},
                                                       "12 cold": {"ready_s": 190.5, "cuda_graphs_s": 129.4}}}
    predicted = tmp_path / "predicted.json"
    predicted.write_text(json.dumps(stand_in))
    raws = sorted((LEASE22 / "call4-probe").glob("calibration-*.json"))
    assert deep.read(raws, [LEASE22 / "call4-probe/layer-probe.tar.xz"], predicted) == 0
    out = capsys.readouterr().out
    assert "12 layers: 3 warm" in out and "4 layers: 3 warm" in out
    assert "ratio 12 / 4 layers (medians, same host): 1.819" in out
    assert "start-up row 12 layers cold: no start" in out
    assert "start-up row 12 layers warm: ready_s [60.6, 53.6, 54.6]" in out


def test_the_read_of_the_committed_raw_reproduces_its_output(capsys) -> None:
    raw = ROOT / "benchmarks/results/2026-11-28-capture-deep-h200/call3-probe"
    read = ROOT / "benchmarks/results/2026-11-28-capture-deep-read/output.txt"
    assert deep.read([raw / "calibration-r1s14-capdeep.json", raw / "calibration-r1s4-capdeep.json"],
                     [raw / "layer-probe.tar.xz"], REGISTERED) == 0
    out = capsys.readouterr().out
    assert out == read.read_text()
    assert "outcome: NOT RESOLVED" in out and out.count("did not start: CUDA out of memory. Tried to allocate 7.03 GiB") == 3
