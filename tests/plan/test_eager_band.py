"""`plan`'s band split by the share of decode steps its own prediction runs eager, and the eager-stretch line with the
flag that removes the stretch (issue 25): the promise a user reads before launch, end to end through `plan`."""

from __future__ import annotations

import re
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.plan.backtest.band import (
    EAGER, EAGER_STRETCH_SHARE, GRAPHED, _decode_band, class_bands, eager_class, error_band,
)
from orchestrator.plan.backtest.dataset import DATASET, load_dataset
from orchestrator.plan.backtest.predict import predict_row

ROOT = Path(__file__).resolve().parents[2]
AGG_TP2 = str(ROOT / "configs/device-h200x2-local-agg-tp2.yaml")  # one V2-Lite server, TP 2, graphs to 256
SYNTHETIC = ["--synthetic", "--set", "benchmark.dataset_path=null"]


def _plan(capsys, *args: str) -> str:
    assert main(["plan", "--config", AGG_TP2, *SYNTHETIC, *args]) == 0
    return capsys.readouterr().out


def test_a_batch_past_its_graphs_prints_the_eager_line_and_its_class_band_and_the_printed_fix_removes_both(capsys):
    band = error_band()
    assert band is not None
    eager, graphed = band.of_class(EAGER), band.of_class(GRAPHED)
    assert eager is not None and graphed is not None and eager.rows + graphed.rows == band.rows

    out = _plan(capsys)
    line = next(line for line in out.splitlines() if line.startswith("back-test error band of this throughput: "))
    assert line.startswith(f"back-test error band of this throughput: ±{eager.mape:.0%} over {eager.rows} "
                           "out-of-sample runs with eager decode stretches")
    assert f"all {band.rows} out-of-sample runs ±{band.mape:.0%}" in line
    stretch = [line for line in out.splitlines() if "eager decode stretch:" in line]
    assert len(stretch) == 1 and stretch[0].startswith("  layout.aggregated.0: eager decode stretch: up to ")
    assert "past its largest CUDA graph (256)" in stretch[0] and "x1.0-2.0 the model's" in stretch[0]
    assert '"The in-run eager step profiled"' in stretch[0]
    flags = re.findall(r"--set (layout\.aggregated\.0\.\w+=\d+) \(memory check: fits", stretch[0])
    assert [f.split("=")[0] for f in flags] == ["layout.aggregated.0.cuda_graph_max_bs",
                                                 "layout.aggregated.0.max_running_requests"]

    for flag in flags:  # either printed fix, applied as printed: no eager stretch, the other class's band, no line
        fixed = _plan(capsys, "--set", flag)
        assert f"±{graphed.mape:.0%} over {graphed.rows} out-of-sample runs without eager decode stretches" in fixed
        assert "eager decode stretch:" not in fixed and "with eager decode stretches" not in fixed
        assert "\nmemory: fits" in fixed


def test_each_out_of_sample_row_is_classed_by_its_prediction_not_its_measurement():
    data = load_dataset(DATASET)
    runs = {r["id"]: r for r in data["runs"] if r.get("sample") == "out" and r.get("kind") == "throughput"}
    graphs256 = predict_row(runs["h100x2-v2lite-agg-tp2-mem080-product-lease4"], data["batches"], DATASET.parent)
    graphs1024 = predict_row(runs["h100x2-v2lite-agg-tp2-mem080-graphs1024-lease4"], data["batches"], DATASET.parent)
    # the same run with graphs to 256 and to 1024: only the graphs differ, and with them the predicted class
    assert eager_class(graphs256.eager_share) == EAGER and graphs1024.eager_share == 0.0
    # a measurement ten times another changes the error, never the class
    row = runs["h100x2-v2lite-agg-tp2-mem080-product-lease4"]
    tenfold = {**row, "measured": {**row["measured"], "total_tok_s": row["measured"]["total_tok_s"] * 10}}
    assert predict_row(tenfold, data["batches"], DATASET.parent).eager_share == graphs256.eager_share
    # the band's classes are the rows' own classes
    band = error_band()
    assert band is not None
    predicted = [predict_row(r, data["batches"], DATASET.parent) for r in runs.values()]
    assert band.classes == class_bands([(r.error, r.eager_share) for r in predicted if r.scope == "run"])


def test_the_class_line_and_the_cached_band_round_trip():
    assert eager_class(EAGER_STRETCH_SHARE) == GRAPHED and eager_class(EAGER_STRETCH_SHARE + 1e-9) == EAGER
    band = error_band()
    assert band is not None and band.classes
    assert _decode_band(asdict(band)) == band  # the disk cache's encode / decode keeps both classes
    assert band.class_mape(1.0) == band.of_class(EAGER).mape
    assert replace(band, classes=()).class_mape(1.0) == band.mape  # no such class: the whole set's band


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_search_rows_show_their_class_band(share):
    from orchestrator.plan.proposals import _band_cell

    band = error_band()
    assert band is not None
    name = eager_class(share)
    assert _band_cell(band, share) == f"±{band.of_class(name).mape:.0%} {name}"
    assert _band_cell(None, share) == f"- {name}"


def test_compare_names_each_simulated_row_under_its_class_band(capsys):
    band = error_band()
    assert band is not None
    graphs = str(ROOT / "configs/device-h200x2-local-agg-tp2.yaml")
    assert main(["compare", "--synthetic", "--configs", graphs, graphs, "--set", "benchmark.dataset_path=null",
                 "--set", "benchmark.num_prompts=1000"]) == 0
    out = capsys.readouterr().out
    eager = band.of_class(EAGER)
    assert eager is not None
    line = next(line for line in out.splitlines() if line.startswith("back-test error band of the simulated"))
    assert f"{eager.text()}: device-h200x2-local-agg-tp2" in line and f"; all: {band.text()}" in line


def test_the_run_s_eager_count_is_the_one_an_observer_of_its_forwards_counts():
    """SimulatedRun.decode_steps against an independent count through simulate_run's observe hook (the reader hattr's
    phase attribution uses): every decode forward, eager where the server's cost model says its batch is past the
    graphs."""
    from orchestrator.config import load_config
    from orchestrator.perfmodel.costmodel import cost_model_for
    from orchestrator.plan.simulation.runs import synthetic_batch
    from orchestrator.plan.simulation.simulate import simulate_run

    cfg = load_config(AGG_TP2, ["benchmark.dataset_path=null"])
    model = cost_model_for(cfg, "aggregated", cfg.layout.groups()[0][2])
    seen = {"steps": 0, "eager": 0, "peak": 0}

    def observe(now, server, forward, schedule) -> None:
        if forward.kind == "decode":
            seen["steps"] += 1
            seen["eager"] += model.decode_runs_eager(len(forward.running))
            seen["peak"] = max(seen["peak"], len(forward.running))

    run = simulate_run(cfg, synthetic_batch(1000, 2025), max_concurrency=None, observe=observe)
    [steps] = run.decode_steps
    assert (steps.steps, steps.eager, steps.peak_running) == (seen["steps"], seen["eager"], seen["peak"])
    assert 0 < steps.eager < steps.steps and run.eager_share == steps.eager / steps.steps


def test_a_graphs_fix_the_memory_check_refuses_is_not_printed(capsys):
    """TP16 over 2x8 H100 with its static pool at 0.94: graphs to the batch's peak leave no headroom for a prefill
    chunk, so the line offers only the running cap; the graphs flag, given by hand, is refused by the same check."""
    tp16 = str(ROOT / "configs/h100-agg-tp16.yaml")
    args = ["plan", "--config", tp16, *SYNTHETIC, "--set", "benchmark.num_prompts=1000",
            "--set", "layout.aggregated.0.mem_fraction_static=0.94"]
    assert main(args) == 0
    out = capsys.readouterr().out
    stretch = next(line for line in out.splitlines() if "eager decode stretch:" in line)
    assert "cuda_graph_max_bs=" not in stretch and "--set layout.aggregated.0.max_running_requests=512" in stretch
    assert main([*args, "--set", "layout.aggregated.0.cuda_graph_max_bs=1000"]) == 1
    assert "\nmemory: does-not-fit" in capsys.readouterr().out
