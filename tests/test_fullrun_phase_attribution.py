"""benchmarks/fullrun_phase_attribution.py: the phase split of a full run's wall, measured and predicted alike."""

from __future__ import annotations

import pytest

from benchmarks import fullrun_phase_attribution as attribution
from orchestrator.plan.backtest.dataset import DATASET, load_dataset
from orchestrator.plan.backtest.predict import predict_row


def test_phases_split_the_wall_by_each_servers_running_batch_against_its_largest_graph():
    # graphs to 1, tail below 2 running in all. s0: A (first token 1 s, answer 4 s), B (2 -> 4); s1: C (3 -> 5);
    # s2: D (3 -> 6); the run ends at 6.5 s. Every request has its first token at 3 s; s0 holds 2 > 1 from 2 to 4 s
    reqs = [attribution.Req("s0", 1.0, 4.0), attribution.Req("s0", 2.0, 4.0), attribution.Req("s1", 3.0, 5.0),
            attribution.Req("s2", 3.0, 6.0)]
    run = attribution.Run(wall_s=6.5, reqs=reqs, graph_max=1)
    phases = attribution.phase_seconds(run, tail_below=2)
    assert phases == {"start": 1.0, "admit": 1.0, "admit/eag": 1.0, "eager": 1.0, "graphed": 1.0, "tail": 1.0,
                      "end": 0.5}
    assert attribution.client_eager_span(run) == (2.0, 4.0)


def test_a_lease_row_splits_into_phases_that_add_up_to_its_measured_and_its_back_test_walls():
    data = load_dataset()
    row = next(r for r in data["runs"] if r["id"] == "h100x2-v2lite-pd-product-mem065-lease4")
    source = attribution.SOURCES[row["id"]]
    assert source is not None
    measured = attribution.read_measured(row, source)
    predicted = attribution.model_run(row, data["batches"])
    assert measured.wall_s == pytest.approx(row["measured"]["duration_s"], abs=0.01) and len(measured.reqs) == 1000
    assert len(predicted.reqs) == 1000 and measured.graph_max == predicted.graph_max == 256
    tokens = row["measured"]["input_tokens"] + row["measured"]["output_tokens"]
    assert tokens / predicted.wall_s == pytest.approx(predict_row(row, data["batches"], DATASET.parent).predicted, rel=1e-9)
    for run in (measured, predicted):
        assert sum(attribution.phase_seconds(run, 32).values()) == pytest.approx(run.wall_s, abs=1e-6)
    # the client-side running batch the phases use tracks the decode log's #running-req at its lines
    checks = attribution.step_check(measured, attribution.server_model(row))["decode-0"]
    assert abs(checks["client_minus_log"][0]) <= 5 and checks["eager_lines"] > 0
    assert checks["eager"]["n"] > 0 and checks["graphed"]["n"] > 10


def test_the_eager_what_if_scales_only_eager_steps_and_restores_the_model():
    data = load_dataset()
    row = next(r for r in data["runs"] if r["id"] == "h100x2-v2lite-pd-product-mem065-lease4")
    model = attribution.server_model(row)
    graphed, eager = model.decode_step_s(200, 200 * 360), model.decode_step_s(600, 600 * 360)
    assert not model.decode_runs_eager(200) and model.decode_runs_eager(600)
    with attribution.eager_steps_scaled(model, 1.5):
        assert model.decode_step_s(200, 200 * 360) == graphed
        assert model.decode_step_s(600, 600 * 360) == pytest.approx(1.5 * eager)
    assert model.decode_step_s(600, 600 * 360) == eager   # restored: the back-test's own model again


def test_a_row_added_later_is_read_from_the_one_archive_beside_its_evidence():
    # a lease's row appended to runs.yaml after this script: no SOURCES entry, its evidence names the call's folder
    row = next(r for r in load_dataset()["runs"] if r["id"] == "h100x2-v2lite-pd-product-mem065-lease3")
    assert attribution.source_of({**row, "id": "a-later-row"}) == attribution.SOURCES[row["id"]]
    # the aggregated run's archive beside a PD row's evidence is not taken for it
    agg = next(r for r in load_dataset()["runs"] if r["id"] == "h100x2-v2lite-agg-tp2-mem080-product-lease3")
    assert attribution.source_of({**agg, "id": "a-later-row", "config": row["config"]}) == ""
