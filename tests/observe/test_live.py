"""The live view: what it shows during a run, in rich and quiet modes, and what it feeds BenchMetrics."""

from __future__ import annotations

import io
import time

import pytest
from prometheus_client import CollectorRegistry
from rich.console import Console

from orchestrator.observe.live import LiveState, LiveView
from orchestrator.observe.metrics import BenchMetrics
from orchestrator.records import RequestResult


def result(index: int, ok: bool = True, prompt: int = 200, completion: int = 50) -> RequestResult:
    return RequestResult(index=index, status="ok" if ok else "failed", prompt_len=prompt, output_len=completion,
                         completion_tokens=completion if ok else 0, done_at=time.time(),
                         error=None if ok else "timeout: decode")


def test_state_tracks_prompts_tokens_failures_and_rates():
    view = LiveView(deadline_s=420, total_prompts=4, total_output_tokens=200, quiet=True, stream=io.StringIO(),
                    started_at=time.time() - 100)
    view.phase("run")
    view.update(result(0))
    view.update(result(1))
    view.update(result(2, ok=False))
    state = view.state()
    assert (state.phase, state.done_prompts, state.done_output_tokens, state.failed) == ("run", 3, 100, 1)
    # just after the run began the rate window is its 1 s floor: 400 prompt and 100 output tokens
    assert 0 < state.decode_tok_s <= 100 and 0 < state.prefill_tok_s <= 400
    assert state.projected_finish_s is not None and state.projected_finish_s >= state.elapsed_s
    assert "on track" in state.verdict


def test_verdict_says_by_how_much_the_deadline_will_be_missed():
    state = LiveState(phase="run", elapsed_s=200, deadline_s=420, done_prompts=10, total_prompts=100,
                      done_output_tokens=100, total_output_tokens=1000, prefill_tok_s=1, decode_tok_s=1,
                      failed=0, projected_finish_s=480.4)
    assert state.verdict == "will miss the deadline by 60 s"
    assert "projected 480s (will miss the deadline by 60 s)" in state.line()
    state.projected_finish_s = None
    assert state.verdict == "no projection yet"


def test_quiet_mode_writes_plain_lines_on_phase_changes_and_at_exit():
    out = io.StringIO()
    with LiveView(deadline_s=420, total_prompts=2, total_output_tokens=100, quiet=True, stream=out,
                  log_interval_s=3600) as view:
        view.phase("warmup")
        view.phase("run")
        view.update(result(0))  # within the interval: no line
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert "warmup" in lines[0] and "run" in lines[1]
    assert "prompts 1/2" in lines[2] and "out-tokens 50/100" in lines[2]
    assert "\x1b[" not in out.getvalue()  # no terminal control codes in job logs


def test_rich_panel_shows_phase_deadline_progress_and_failures():
    view = LiveView(deadline_s=420, total_prompts=10, total_output_tokens=500, quiet=True, stream=io.StringIO(),
                    started_at=time.time() - 30)
    view.phase("run")
    view.update(result(0))
    view.update(result(1, ok=False))
    console = Console(file=io.StringIO(), width=110, color_system=None)
    console.print(view)
    text = console.file.getvalue()
    for expected in ("phase", "run", "of 420 s", "2/10", "50/500", "prefill", "decode", "tok/s", "failed",
                     "projected finish", "deadline", "prompts done", "tokens done"):
        assert expected in text, f"{expected!r} missing from\n{text}"


def test_view_feeds_bench_metrics():
    registry = CollectorRegistry()
    metrics = BenchMetrics(run_id="r1", layout="1P/1D", deadline_s=420, registry=registry)
    view = LiveView(deadline_s=420, total_prompts=3, total_output_tokens=150, quiet=True, stream=io.StringIO(),
                    metrics=metrics)
    view.phase("run")
    view.update(result(0))
    labels = {"run_id": "r1", "layout": "1P/1D"}
    assert registry.get_sample_value("pdorch_phase", {**labels, "phase": "run"}) == 1
    assert registry.get_sample_value("pdorch_bench_done_prompts", labels) == 1
    assert registry.get_sample_value("pdorch_bench_done_output_tokens", labels) == 50
    assert registry.get_sample_value("pdorch_projected_finish_seconds", labels) is not None
    assert [p["name"] for p in metrics.timeline_dicts()] == ["run"]


def test_sim_time_scale_reports_elapsed_and_rates_in_simulated_seconds():
    # time_scale 0.05: one wall second is 20 simulated seconds, so tok/s per simulated second is 20x lower
    metrics = BenchMetrics(run_id="r1", layout="1P/1D", deadline_s=420, started_at=time.time() - 5, time_scale=0.05)
    view = LiveView(deadline_s=420, total_prompts=2, total_output_tokens=100, quiet=True, stream=io.StringIO(),
                    metrics=metrics)
    assert view.state().elapsed_s >= 100  # 5 wall seconds
    assert metrics.elapsed_s() >= 100
    view.phase("run")
    view.update(result(0, prompt=200, completion=50))
    state = view.state()
    assert state.decode_tok_s == pytest.approx(50 * 0.05)  # 1 s wall floor = 20 simulated s
    assert state.prefill_tok_s == pytest.approx(200 * 0.05)
