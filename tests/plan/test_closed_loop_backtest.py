"""The closed-loop back-test: measured AIPerf points predicted at their config and N, errors computed as stated."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.plan.closedloop.backtest import DATASET, closed_loop_backtest, closed_loop_band


def test_every_row_is_predicted_and_its_errors_are_predicted_over_measured():
    rows = yaml.safe_load(DATASET.read_text())["rows"]
    checks = closed_loop_backtest()
    assert [c.row_id for c in checks] == [r["id"] for r in rows]
    for check, row in zip(checks, rows):
        assert row["sample"] == "out" and row["bound"] is None  # reported, not pinned: no bound was set beforehand
        assert check.measured == row["measured"]
        assert check.error("output_tok_s") == pytest.approx(check.predicted["output_tok_s"] / row["measured"]["output_tok_s"] - 1)
        assert check.gate_agrees == ((check.predicted["good_fraction"] >= 0.9) == (row["measured"]["good_fraction"] >= 0.9))


def test_the_band_is_the_mape_of_the_models_rows_and_none_for_another_model(tmp_path):
    band = closed_loop_band("qwen3-235b-a22b-fp8")
    assert band is not None
    mape = sum(abs(c.error("output_tok_s")) for c in band.checks) / len(band.checks)
    assert f"output tok/s ±{mape:.0%} (MAPE of {len(band.checks)} measured points" in band.text()
    assert closed_loop_band("DeepSeek-R1") is None
    assert closed_loop_band("qwen3-235b-a22b-fp8", tmp_path / "missing.yaml") is None
