"""benchmarks/run_start_timeline.py: the first seconds of a measured run, read from its committed server logs."""

from __future__ import annotations

import pytest

from benchmarks import run_start_timeline as timeline
from orchestrator.plan.backtest.dataset import load_dataset


def test_prefill_lines_are_placed_from_their_gaps_inside_their_one_second_stamps():
    # true times 100.30, 100.90 (8192 tokens in 0.60 s) and 101.15 (4096 in 0.25 s); the stamps only say 100, 100, 101
    lines = [{"t": 100.0, "new_tokens": 8192, "input_tok_s": 1.0},
             {"t": 100.0, "new_tokens": 8192, "input_tok_s": 8192 / 0.60},
             {"t": 101.0, "new_tokens": 4096, "input_tok_s": 4096 / 0.25}]
    times, window = timeline.chain_times(lines)
    # the chain fits the stamps only for a first line in [100.15, 100.40]: the last line caps it from below, the second from above
    assert times[1] - times[0] == pytest.approx(0.60) and times[2] - times[1] == pytest.approx(0.25)
    assert 100.15 <= times[0] <= 100.40 and window == pytest.approx(0.25)


@pytest.fixture(scope="module")
def rows() -> dict:
    data = load_dataset()
    return {r["id"]: r for r in data["runs"]}


def test_a_cold_pd_prefill_spends_seconds_in_the_runs_first_full_chunk_and_a_warm_one_does_not(rows):
    cold = timeline.report(rows["h100x2-v2lite-pd-product-mem065-lease3"], {}, with_model=False)
    warm = timeline.report(rows["h100x2-v2lite-pd-product-mem055-lease4"], {}, with_model=False)
    assert cold is not None and warm is not None
    assert "prefill-0/0 cold" in cold["caches"] and "prefill-0/0 warm" in warm["caches"]
    for run in (cold, warm):
        # the first request reached the prefill's scheduler and its forward was enqueued within 0.4 s of the first send
        assert 0 < run["pdo"]["first_msg"][0] < 0.4
        assert run["servers"][0]["chunk"] == 8192 and run["servers"][0]["aligned_before"] == []
    assert cold["pdo"]["run_ms"][0] > 1500 and warm["pdo"]["run_ms"][0] < 300
    assert cold["first_token_s"] - warm["first_token_s"] > 1.2


def test_without_our_router_a_lone_server_sees_the_burst_within_half_a_second():
    seen = timeline.direct_burst(timeline.ROOT / next(iter(timeline.DIRECT.values())))
    assert max(n for t, n in seen if t <= 0.6) >= 950


def test_lease_9s_cold_run_with_the_full_chunk_warm_up_has_its_compile_before_the_run(capsys):
    """The GPU check of warmup_batch's full-chunk prompt (benchmarks/results/2026-11-27-warmup-fix-h100): on a fresh
    machine the run's first forward launches without a compile, and the seconds moved into the warm-up."""
    archive = "benchmarks/results/2026-11-27-warmup-fix-h100/pd-warmupfix.tar.xz"
    out = timeline.report({"id": "lease9", "config": "device-h100x1-1p1d"}, {}, False, archive)
    assert out is not None and out["pdo"] is not None
    assert out["pdo"]["run_ms"][0] <= 300
    assert max(ms for ms, _ in out["pdo"]["slow_before"] if ms < 60_000) >= 1000
    assert timeline.main(["--archive", archive]) == 0 and "iterations before the run" in capsys.readouterr().out


def test_a_warm_up_inside_the_runs_first_second_is_not_taken_for_the_run():
    """Lease 13's aggregated run (benchmarks/results/2026-11-27-lease13-h100): its 1.2 s warm-up's own full-chunk
    forward (0bb4edb: one chunk-sized prompt alone first) ran 0.65 s before the first send; the run starts after it."""
    archive = "benchmarks/results/2026-11-27-lease13-h100/call6-product/burst-shipped.tar.xz"
    out = timeline.report({"id": "lease13-agg", "config": "device-h200x2-local-agg-tp2"}, {}, False, archive)
    assert out is not None
    server = out["servers"][0]
    assert server["before"][-4:] == [8192, 64, 705, 6656]   # the warm-up: its long prompt, its remainder, the short ones
    t, seqs, tokens = server["first_lines"][0]
    assert t > 0 and (seqs, tokens) == (1, 8192)
    assert "router" not in server  # a result.json from before the router's stamps: nothing printed for them


def test_a_recorded_runs_router_stamps_are_read_per_server():
    """benchmarks/results/2026-11-27-router-stamps: a local PD bench (Ray, Serve, our router, simulated SGLang over
    HTTP) whose result.json carries the router's stamps: when it posted each prefill leg and read its answer's head."""
    archive = "benchmarks/results/2026-11-27-router-stamps/router-stamps-pd.tar.xz"
    out = timeline.report({"id": "stamps", "config": "configs/default.yaml"}, {}, False, archive)
    assert out is not None
    router = out["servers"][0]["router"]
    assert router["leg"] == "prefill"
    assert 0 <= router["posted_99_s"] <= router["heads_99_s"]  # each head after its own post, so the k-th after the k-th


def test_sent_by_names_when_the_router_had_posted_as_many_legs_as_the_scheduler_saw():
    legs = {"posted": [0.01, 0.25, 0.5]}
    assert timeline.sent_by(legs, 2) == " (sent by the router by +0.25 s)"
    assert timeline.sent_by(legs, 5) == " (sent by the router by +0.50 s)"  # the scheduler counts more (a warm-up's)
    assert timeline.sent_by(None, 2) == ""
