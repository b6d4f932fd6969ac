"""A/B compare: one batch on several layouts, ratios, non-fitting rows, predicted vs measured runs."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.plan.compare import (
    SIM_ENGINE,
    compare,
    compare_table,
    find_real_run,
    measured_from_records,
)
from orchestrator.plan.simulation.simulate import simulate_run, synthetic_batch
from orchestrator.records import RequestResult
from orchestrator.run.bench import run_bench

ROOT = Path(__file__).resolve().parents[2]
BATCH = synthetic_batch(200, seed=9)


@pytest.fixture(autouse=True)
def _no_earlier_runs(tmp_path, monkeypatch) -> None:
    """compare() shows real runs found under benchmark.result_dir (relative to cwd): start from none."""
    monkeypatch.chdir(tmp_path)


def configs(*names: str, overrides: tuple[str, ...] = ()):
    return [(name, load_config(ROOT / f"configs/{name}.yaml", list(overrides))) for name in names]


def test_pd_and_aggregated_on_h100_and_h200_in_one_table_with_ratios_to_the_first() -> None:
    rows = compare(configs("h100-1p1d-tp8", "h100-agg-tp16", "h200-1p1d-tp8", "h200-agg-tp16"), BATCH)
    assert [r.source for r in rows] == ["simulated"] * 4
    assert rows[0].ratio == 1.0
    for row, (_, cfg) in zip(rows, configs("h100-1p1d-tp8", "h100-agg-tp16", "h200-1p1d-tp8", "h200-agg-tp16")):
        assert row.output_throughput == pytest.approx(simulate_run(cfg, BATCH).output_throughput)
        assert row.ratio == pytest.approx(row.output_throughput / rows[0].output_throughput)
        assert row.verdict == "VALID" and row.startup_s > 0 and row.ttft_p50_s <= row.ttft_p99_s
    table = compare_table(rows)
    assert table.count("simulated") == 4 and "agg:1AxTP16" in table


def test_a_layout_that_does_not_fit_gets_a_row_that_says_why() -> None:
    rows = compare(configs("default", "h100-2p1d-tp4"), BATCH)
    assert rows[1].memory == "does-not-fit" and math.isnan(rows[1].output_throughput)
    assert "TP4 needs 92.1 GB/GPU" in rows[1].note
    assert "note: does not fit" in compare_table(rows)


def _records(n: int, duration_s: float) -> list[dict]:
    return [
        RequestResult(index=i, status="ok", prompt_len=100, output_len=50, completion_tokens=50,
                      ttft_s=0.5, e2e_s=duration_s, sent_at=1000.0, done_at=1000.0 + duration_s).to_dict()
        for i in range(n)
    ]


def test_measured_numbers_come_from_the_per_prompt_records() -> None:
    records = _records(10, 4.0) + [RequestResult(index=10, status="failed", prompt_len=5, output_len=5,
                                                 sent_at=1000.0, error="timeout").to_dict()]
    measured = measured_from_records(records)
    assert measured.output_tokens == 500 and measured.duration_s == 4.0 and len(measured.e2e_s) == 10


def test_an_existing_real_run_of_the_same_layout_is_shown_with_the_prediction_error(tmp_path: Path) -> None:
    (name, cfg), = configs("default", overrides=(f"benchmark.result_dir={tmp_path}",))
    other = load_config(ROOT / "configs/h200-agg-tp16.yaml")
    for run_id, run_cfg in (("run-a", cfg), ("run-b", other)):
        (tmp_path / run_id).mkdir()
        result = {"run_id": run_id, "verdict": "VALID", "duration_s": 100.0, "total_s": 180.0,
                  "metadata": {"config": run_cfg.model_dump(mode="json")}, "results": _records(200, 100.0)}
        (tmp_path / run_id / "result.json").write_text(json.dumps(result))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "result.json").write_text("{not json")
    # newer runs of the same layout that measure another prediction: Ctrl-C'd, and a --set prompt count
    smaller = cfg.model_copy(update={"benchmark": cfg.benchmark.model_copy(update={"num_prompts": 300})})
    for run_id, run_cfg, verdict in (("interrupted", cfg, "INVALID: interrupted during measured run: received SIGINT"),
                                     ("300-prompts", smaller, "VALID")):
        (tmp_path / run_id).mkdir()
        result = {"run_id": run_id, "verdict": verdict, "duration_s": 7.0, "total_s": 65.0,
                  "metadata": {"config": run_cfg.model_dump(mode="json")}, "results": _records(95, 7.0)}
        (tmp_path / run_id / "result.json").write_text(json.dumps(result))
        os.utime(tmp_path / run_id / "result.json", (time.time() + 60, time.time() + 60))
    path, measured = find_real_run(cfg)
    assert path == tmp_path / "run-a" / "result.json" and measured.output_tokens == 200 * 50

    rows = compare([(name, cfg)], BATCH)
    assert [r.source for r in rows] == ["simulated", SIM_ENGINE]  # a sim-engine run: the simulator's wall time
    assert rows[1].output_throughput == pytest.approx(100.0)
    assert rows[1].total_s == 180.0 and rows[1].verdict == "VALID"
    assert rows[1].error == pytest.approx(rows[0].output_throughput / 100.0 - 1)
    assert "run-a/result.json" in compare_table(rows)


@pytest.mark.ray
def test_the_real_path_runs_bench_and_shows_predicted_vs_measured(request, make_sim_config) -> None:
    request.getfixturevalue("ray_driver")  # the session cluster, only once the parts exist
    cfg = make_sim_config()
    rows = compare([("sim-1p1d", cfg)], synthetic_batch(12, seed=1),
                   measure=lambda c: run_bench(c, quiet=True, num_prompts=12))
    predicted, measured = rows
    assert (predicted.source, measured.source) == ("simulated", SIM_ENGINE)
    assert measured.output_throughput > 0 and measured.verdict == "VALID"
    if "fell behind the cost model" in measured.note:  # a busy host timed this run: no error against the prediction
        assert measured.error is None and measured.note.startswith("this run; ")
    else:
        assert measured.error is not None and measured.note == "this run"
