"""benchmarks/fullrun_step_ledger.py: a full run's decoding server step by step, measured and predicted alike."""

from __future__ import annotations

import time

import pytest

from benchmarks import fullrun_step_ledger as ledger
from benchmarks.fullrun_phase_attribution import Req, measured_full_runs, source_of
from orchestrator.plan.backtest.dataset import DATASET, load_dataset
from orchestrator.plan.backtest.predict import predict_row


def _line(stamp: float, running: int, gen_tok_s: float, graph: bool = True) -> dict:
    # logparse reads stamps as local time; the script turns them back to the UTC the servers wrote
    return {"t": time.mktime(time.gmtime(stamp)), "running": running, "gen_tok_s": gen_tok_s, "cuda_graph": graph}


def test_decode_lines_are_placed_by_their_generated_tokens_over_the_logged_throughput():
    # every 10 steps of 100 running at 2000 tok/s: 0.5 s apart; stamps floored to the second
    lines = [_line(1000.2 + 0.5 * k, 100, 2000.0) for k in range(6)]
    times, gaps, window = ledger.chain_decode(lines, 10)
    assert gaps[1:] == pytest.approx([0.5] * 5)
    assert [b - a for a, b in zip(times, times[1:])] == pytest.approx([0.5] * 5)
    assert window >= 0 and all(int(t) == int(1000.2 + 0.5 * k) for k, t in enumerate(times))


def test_an_interval_that_crosses_the_largest_graph_splits_where_the_batch_crosses_it():
    prev, line = _line(0, 300, 1.0, graph=False), _line(1, 220, 1.0, graph=True)
    # 300 -> 220 over 40 steps crosses 256 after 44 of the 80 finished requests: 22 eager steps, 18 graphed
    assert ledger.interval_parts(prev, line, 40, 256) == [(True, 22, 278.5), (False, 18, 238.0)]
    same = _line(1, 280, 1.0, graph=False)
    assert ledger.interval_parts(prev, same, 40, 256) == [(True, 40, 290.0)]
    assert ledger.interval_parts(None, same, 7, 256) == [(True, 7, 280)]


def test_a_phase_difference_splits_into_step_count_batch_mix_and_step_price():
    measured = [ledger.Interval("eager", 10, 1.0, 400, model_s=0.6)]   # 100 ms steps; the model 60 ms at those batches
    predicted = [ledger.Interval("eager", 1, 0.05, 380) for _ in range(12)]   # 12 steps of 50 ms
    count, mix, price = ledger.split(measured, predicted)
    assert count == pytest.approx(2 * 0.1) and mix == pytest.approx(12 * (0.05 - 0.06))
    assert price == pytest.approx(12 * (0.06 - 0.1))
    assert count + mix + price == pytest.approx(12 * 0.05 - 1.0)


def test_the_running_context_grows_with_each_requests_output_and_counts_only_its_server():
    reqs = [Req("d0", 1.0, 2.0, 100, 50), Req("d0", 0.0, 1.2, 10, 10), Req("d1", 1.0, 3.0, 1000, 10)]
    assert ledger.context_per_request(reqs, "d0", 1.5) == pytest.approx(125.0)
    assert ledger.context_per_request(reqs, "d0", 5.0) == 0.0


def test_both_ledgers_of_a_row_cover_its_measured_and_its_back_test_walls():
    data = load_dataset()
    row = next(r for r in measured_full_runs(data) if r["id"] == "h100x2-v2lite-agg-tp1-product-mem065-inrun-lease7")
    measured = ledger.measured_ledger(row, source_of(row))
    predicted, _ = ledger.predicted_ledger(row, data["batches"])
    assert sum(measured.phase_s(p) for p in ledger.PHASES) == pytest.approx(row["measured"]["duration_s"], abs=0.01)
    tokens = row["measured"]["input_tokens"] + row["measured"]["output_tokens"]
    back_test = predict_row(row, data["batches"], DATASET.parent).predicted
    assert tokens / sum(predicted.phase_s(p) for p in ledger.PHASES) == pytest.approx(back_test, rel=1e-9)
    # the aggregated server ran its 42 prefill forwards before any decode step on both sides, every step logged once
    assert measured.prefill_forwards == predicted.prefill_forwards == 42
    assert all(i.phase in ledger.STEP_PHASES and i.steps >= 1 for i in measured.intervals + predicted.intervals)
    assert abs(sum(i.steps for i in measured.intervals) - sum(i.steps for i in predicted.intervals)) <= 10


def test_a_row_without_its_decoding_servers_log_is_named_not_read():
    data = load_dataset()
    row = next(r for r in measured_full_runs(data) if r["id"] == "h200x2-v2lite-agg-dp2")
    with pytest.raises(ledger.NotReadable, match="2 decoding server logs"):
        ledger.report(row, data["batches"])
