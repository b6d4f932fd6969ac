"""The closed-loop back-test: measured AIPerf points predicted at their config and N, errors computed as stated,
bounds set before a run kept as set, and pre-registered predictions read from their committed files."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from orchestrator.plan.closedloop.backtest import (
    DATASET,
    ROOT,
    closed_loop_backtest,
    closed_loop_band,
    closed_loop_table,
)

# The bounds as they were set before the runs they bound (3065ed9, before hdev's two-GPU Qwen3 run): a bound may be
# tightened, never widened, so no row's bound may exceed these.
GOALS = {"output_tok_s": 0.15, "ttft_p50_ms": 0.25, "itl_p50_ms": 0.25, "ready_s": 0.25, "ready_cold_s": 0.25}


def test_every_row_is_predicted_and_its_errors_are_predicted_over_measured():
    rows = yaml.safe_load(DATASET.read_text())["rows"]
    checks = closed_loop_backtest()
    assert [c.row_id for c in checks] == [r["id"] for r in rows]
    for check, row in zip(checks, rows):
        assert row["sample"] == "out"
        if row["bound"] is None:
            assert row["measured"] is not None  # reported, not pinned: a measured row whose bound came too late
        else:
            assert row["bound_set"] and set(row["bound"]) <= set(GOALS)
            assert all(row["bound"][k] <= GOALS[k] for k in row["bound"])
        if row["measured"] is None:
            assert check.pending and math.isnan(check.error("output_tok_s"))
            continue
        assert check.measured == row["measured"]
        assert check.error("output_tok_s") == pytest.approx(check.predicted["output_tok_s"] / row["measured"]["output_tok_s"] - 1)
        assert check.gate_agrees == ((check.predicted["good_fraction"] >= 0.9) == (row["measured"]["good_fraction"] >= 0.9))


def test_a_pre_registered_prediction_is_read_from_its_committed_file():
    rows = {r["id"]: r for r in yaml.safe_load(DATASET.read_text())["rows"]}
    recorded = [c for c in closed_loop_backtest() if c.recorded]
    assert recorded, "the two-GPU Qwen3 rows carry the prediction recorded before their run"
    for check in recorded:
        specs = rows[check.row_id]["recorded"]
        for spec, got in zip(specs if isinstance(specs, list) else [specs], check.recorded, strict=True):
            document = json.loads((ROOT / spec["path"]).read_text())
            row = next(r for r in document["rows"] if r["concurrency"] == check.concurrency)
            assert got.commit == spec["commit"] and got.values["output_tok_s"] == row["output_tok_s"]
            assert got.values["ttft_p50_ms"] == row["ttft_ms"]["p50"]
            assert got.values["ready_s"] == pytest.approx(document["time_to_ready"]["ready_s"])


def test_a_measured_row_is_judged_against_its_bound_and_the_recorded_prediction(tmp_path):
    config = "configs/device-h200x2-qwen3-serve.yaml"
    predicted = closed_loop_backtest()  # the dataset's own two-GPU row gives the prediction to measure against
    n4 = next(c for c in predicted if c.row_id == "hdev-h200x2-qwen3-l6-gateway-n4")
    measured = {"output_tok_s": n4.predicted["output_tok_s"] / 1.10, "good_fraction": 1.0,   # +10 %: inside ±15 %
                "ttft_p50_ms": n4.predicted["ttft_p50_ms"] / 0.5, "itl_p50_ms": n4.predicted["itl_p50_ms"]}  # -50 %
    dataset = tmp_path / "closed_loop.yaml"
    dataset.write_text(yaml.safe_dump({"rows": [{
        "id": "two-gpu-n4", "config": config, "concurrency": 4, "measured": measured, "sample": "out",
        "bound": {"output_tok_s": 0.15, "ttft_p50_ms": 0.25}, "bound_set": "test",
        "recorded": {"path": "benchmarks/results/2026-11-26-qwen3-l6-two-gpu-predicted/plan-H200.json", "commit": "x"},
    }]}))
    (check,) = closed_loop_backtest(dataset)
    assert check.inside("output_tok_s") is True and check.inside("ttft_p50_ms") is False
    assert check.inside("itl_p50_ms") is None  # no bound on it: reported only
    assert check.recorded_error("output_tok_s") == pytest.approx(
        check.recorded[0].values["output_tok_s"] / measured["output_tok_s"] - 1)
    table = closed_loop_table([check])
    assert "(+10% ok)" in table and "(-50% MISS)" in table
    assert "1 of 2 bounded metrics inside the bound set before the run; misses: two-gpu-n4 TTFT p50 ms (-50%)" in table
    head, row = table.splitlines()[:2]  # text mode is column-aligned, as the main back-test table is
    assert row[head.index("N "):].startswith("4 ") and row[head.index("bound (set)"):].startswith("out tok/s ±15%")


def test_the_band_is_the_mape_of_the_models_measured_rows_and_none_for_another_model(tmp_path):
    band = closed_loop_band("qwen3-235b-a22b-fp8")
    assert band is not None
    mape = sum(abs(c.error("output_tok_s")) for c in band.checks) / len(band.checks)
    assert f"output tok/s ±{mape:.0%} (MAPE of {len(band.checks)} measured points" in band.text()
    assert all(not c.pending for c in closed_loop_band("qwen3-235b-a22b-fp8-l6").checks)
    assert closed_loop_band("DeepSeek-R1") is None
    assert closed_loop_band("qwen3-235b-a22b-fp8", tmp_path / "missing.yaml") is None
