"""What a user sees: latency percentiles in the result, report, live view; rendering an existing result;
the scaling analysis; the notices a clean run must not print twice or at all; the README's sim-server line."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from orchestrator.observe.live import LiveView
from orchestrator.records import RequestResult
from orchestrator.observe.report import LatencySummary, ThroughputSummary, our_lines, result_block, total_throughputs
from orchestrator.observe.stored import read_result, render_result

REPO = Path(__file__).resolve().parents[2]
H200X2 = REPO / "benchmarks/results/device-h200x2-2026-11-21/raw.tar.xz"
PD_RUN = f"{H200X2}:c4/c/runs/device-h200x2-1p1d-20261121-200259-e5b7c1/result.json"
AGG_RUN = f"{H200X2}:c5/c/runs/device-h200x2-agg-20261121-200553-ec653f/result.json"


def ok(index: int, ttft: float, e2e: float, tokens: int, kv_wait: float | None = None, prompt: int = 100,
       done_at: float | None = None) -> RequestResult:
    return RequestResult(index=index, status="ok", prompt_len=prompt, output_len=tokens, completion_tokens=tokens,
                         ttft_s=ttft, e2e_s=e2e, kv_wait_s=kv_wait, done_at=done_at)


# ---- latency percentiles ------------------------------------------------------------------------


def test_latency_summary_uses_bench_serving_definitions():
    results = [ok(i, ttft=0.1 * (i + 1), e2e=0.1 * (i + 1) + 0.02 * 9, tokens=10, kv_wait=0.05 * (i + 1))
               for i in range(11)]
    results.append(RequestResult(index=99, status="failed", prompt_len=5, output_len=5, error="x"))
    results.append(ok(50, ttft=0.5, e2e=0.5, tokens=1))  # one token: no TPOT sample
    lat = LatencySummary.from_results(results)
    assert lat.get("ttft", "count") == 12 and lat.get("tpot", "count") == 11
    assert lat.get("tpot", "p50") == pytest.approx(0.02)  # (e2e - ttft) / (tokens - 1)
    ttfts = [r.ttft_s for r in results if r.status == "ok"]
    assert lat.get("ttft", "p90") == pytest.approx(float(np.percentile(ttfts, 90)))  # as bench_serving
    assert lat.get("ttft", "p90") == pytest.approx(0.99)
    assert lat.get("kv_wait", "p99") == pytest.approx(0.5 + 0.05 * 0.9)
    assert lat.text("tpot") == "20.0 / 20.0 / 20.0"  # TPOT is shown in ms
    aggregated = LatencySummary.from_results([ok(0, 0.1, 1.0, 5)])
    assert aggregated.get("kv_wait", "p50") is None and aggregated.text("kv_wait") == "-"
    assert json.loads(json.dumps(lat.to_dict()))["ttft"]["p99"] == pytest.approx(lat.get("ttft", "p99"))


def test_latency_lines_come_after_sglangs_block_which_stays_byte_for_byte():
    from orchestrator.observe.report import RunVerdict

    summary = ThroughputSummary("engine", 2, 10.0, 300, 20, 1.5)
    verdict = RunVerdict("sim", "1PxTP1/1DxTP1", 420, 100, [], 2, 2, 0)
    lat = LatencySummary.from_results([ok(0, 0.5, 2.0, 10, 0.4), ok(1, 1.5, 3.0, 10, 1.2)])
    text = result_block(summary) + "\n" + our_lines(verdict, lat)
    block = result_block(summary)
    assert text.startswith(block + "\n") and block.endswith("\n" + "=" * 50)
    assert len(block.splitlines()) == 13 and "TTFT" not in block  # SGLang's 11 rows + blank line + rule
    ours = text[len(block) + 1:]
    assert "TTFT p50/p90/p99 (s):                    1.000 / 1.400 / 1.490" in ours
    assert "KV wait p50/p90/p99 (s):" in ours and "TPOT p50/p90/p99 (ms):" in ours
    assert ours.index("Prompts completed") < ours.index("TTFT") < ours.index("Deadline verdict")


def test_a_logs_result_blocks_are_read_back_in_order_as_the_block_wrote_them():
    first, second = ThroughputSummary("engine", 2, 10.0, 300, 20, 1.5), ThroughputSummary("engine", 4, 8.0, 900, 60, 3.0)
    log = "noise: Total token throughput (tok/s): 1\n" + result_block(first) + "\nmore\n" + result_block(second)
    assert total_throughputs(log) == [32.0, 120.0]  # (300 + 20) / 10 s, (900 + 60) / 8 s; an indented mention is not a block


def test_the_real_2xh200_runs_render_with_their_stored_ttft():
    pd_text = render_result(read_result(PD_RUN))
    agg_text = render_result(read_result(AGG_RUN))
    assert "Total token throughput (tok/s):          13046.38" in pd_text
    assert re.search(r"TTFT p50/p90/p99 \(s\):\s+5\.843 / ", pd_text)
    assert re.search(r"TTFT p50/p90/p99 \(s\):\s+2\.052 / ", agg_text)
    assert re.search(r"KV wait p50/p90/p99 \(s\):\s+5\.8", pd_text)
    assert re.search(r"KV wait p50/p90/p99 \(s\):\s+-", agg_text)  # aggregated: nothing to transfer
    assert "Deadline verdict:                        VALID" in pd_text


@pytest.mark.parametrize("spec,words", [
    ("nope/result.json", "cannot read it"),
    (f"{H200X2}:c9/missing/result.json", "has no member"),
    ("nope.tar.xz:x/result.json", "no file nope.tar.xz"),
])
def test_report_of_a_missing_result_is_one_clear_line(spec, words):
    with pytest.raises(ValueError) as err:
        read_result(spec)
    assert words in str(err.value) and "\n" not in str(err.value) and str(err.value).startswith("--result ")


def test_a_stored_xz_result_reads_as_the_result_json_it_was_and_a_broken_one_is_one_line(tmp_path):
    import lzma

    # benchmarks/results/ keeps its large result.json files xz-compressed (the tree every device call carries)
    stored = next((REPO / "benchmarks/results/2026-11-24-embedded-vs-plan/run2/runs").glob("*/result.json.xz"))
    plain = tmp_path / "result.json"
    plain.write_bytes(lzma.decompress(stored.read_bytes()))
    assert read_result(stored) == read_result(plain)
    assert "Total token throughput (tok/s):          6743.81" in render_result(read_result(stored))
    broken, cut_off = tmp_path / "broken.json.xz", tmp_path / "cut-off.json.xz"
    broken.write_bytes(b"not xz")
    cut_off.write_bytes(stored.read_bytes()[:1000])
    for damaged in (broken, cut_off):
        with pytest.raises(ValueError) as err:
            read_result(damaged)
        assert "cannot read it" in str(err.value) and str(damaged) in str(err.value) and "\n" not in str(err.value)


def test_html_report_shows_percentiles_of_tpot_and_kv_wait(tmp_path):
    from orchestrator.observe.html_report import write_report

    page = write_report(None, tmp_path, document=read_result(PD_RUN)).read_text()
    assert "<th>TTFT p50 / p90 / p99</th><td>5.843 s / " in page
    assert re.search(r"<th>TPOT p50 / p90 / p99</th><td>[\d.]+ ms / [\d.]+ ms / [\d.]+ ms</td>", page)
    assert "<th>KV wait p50 / p90 / p99</th><td>5.8" in page
    assert "<th>total tok/s</th><td>13,046</td>" in page


# ---- live view ----------------------------------------------------------------------------------


def test_live_view_final_frame_shows_the_runs_averages_not_zero():
    out = io.StringIO()
    start = time.time() - 200
    with LiveView(deadline_s=420, total_prompts=2, total_output_tokens=150, quiet=True, stream=out,
                  started_at=start, log_interval_s=3600) as view:
        view.phase("run")
        view.update(ok(0, 0.5, 4.0, 100, kv_wait=0.4, prompt=300, done_at=start))  # long before the 10 s window
        view.update(ok(1, 1.5, 6.0, 50, kv_wait=1.2, prompt=100, done_at=start))
        view._run_started_s = view._elapsed() - 8.0  # the run took 8 s
        view.phase("report")
        state = view.state()
    assert state.final and state.prefill_tok_s == pytest.approx(400 / 8, rel=0.02)
    assert state.decode_tok_s == pytest.approx(150 / 8, rel=0.02)
    last = out.getvalue().splitlines()[-1]
    assert "run average: prefill 50 tok/s  decode 19 tok/s" in last, last
    assert "prefill 0 tok/s" not in last
    assert "TTFT p50/p90/p99 1.00/1.40/1.49 s" in last and "KV wait p50/p90/p99 0.80/1.12/1.19 s" in last
    from rich.console import Console

    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(view)  # the rich panel's last frame says the same
    panel = console.file.getvalue()
    assert "run average: prefill 50 tok/s  decode 19 tok/s" in panel and "1.00/1.40/1.49 s" in panel


# ---- notices ------------------------------------------------------------------------------------


def test_sharegpt_notice_prints_once_per_file_per_process(tmp_path, caplog):
    from orchestrator.workload.sharegpt_file import load_sharegpt

    good = {"conversations": [{"value": "hello there"}, {"value": "general kenobi"}]}
    path = tmp_path / "ShareGPT.json"
    path.write_text(f"[{json.dumps(good)}, {json.dumps(good)}, {json.dumps(good)[:20]}")  # cut: a warning
    caplog.set_level(logging.INFO, logger="orchestrator.workload.sharegpt_file")
    load_sharegpt(path)
    load_sharegpt(path)  # the warm-up batch reads it again
    notices = [r for r in caplog.records if r.name == "orchestrator.workload.sharegpt_file" and "ShareGPT" in r.getMessage()]
    assert len(notices) == 1 and notices[0].levelno == logging.WARNING


def test_serve_self_kill_notices_are_hidden_and_other_raylet_lines_are_not(capsys):
    import ray._private.worker as worker

    from orchestrator.cluster.connect import hide_serve_self_kill_errors

    original = worker.print_to_stdstream
    try:
        hide_serve_self_kill_errors()
        hide_serve_self_kill_errors()  # idempotent: one filter
        for message in ("Task ServeController.graceful_shutdown failed. There are infinite retries remaining, so the "
                        "task will be retried. Error: The actor is dead because it was killed by `ray.kill`.",
                        "Task ServeController.listen_for_change failed. There are infinite retries remaining, so "
                        "the task will be retried. Error: The actor is dead because it was killed by `ray.kill`.",
                        "Task Router.generate_batch failed: worker crashed (OOM)"):
            worker.print_to_stdstream({"lines": [message], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    finally:
        worker.print_to_stdstream = original
    out = capsys.readouterr().out
    assert "ServeController" not in out and "killed by `ray.kill`" not in out
    assert "Task Router.generate_batch failed: worker crashed (OOM)" in out


def _readme_sim_server_line() -> str:
    row = next(line for line in (REPO / "README.md").read_text().splitlines() if "sim-server" in line)
    return re.search(r"`(pd-orchestrator sim-server [^`]+)`", row).group(1).replace("\\|", "|")


@pytest.mark.slow
def test_readme_sim_server_example_starts_as_written(tmp_path):
    from orchestrator.cluster.ports import free_port

    line = _readme_sim_server_line()
    port, bootstrap = free_port(), free_port()
    argv = shlex.split(line.replace("prefill|decode|null", "prefill").replace(" P", f" {port}"))
    assert argv[:4] == ["pd-orchestrator", "sim-server", "--mode", "prefill"]
    argv += ["--disaggregation-bootstrap-port", str(bootstrap)]  # a free one: other tests run beside us
    # as written it models R1's start-up on 8 H100s in real time (~70 s); a hundredth of every simulated duration
    # keeps that model and waits well under a second
    argv += ["--time-scale", "0.01"]
    log = open(tmp_path / "sim.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).parent / argv[0]), *argv[1:]], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
            except httpx.HTTPError:
                status = None
            if status == 200:
                break
            time.sleep(0.2)  # polling /health, the condition itself
        assert status == 200, (tmp_path / "sim.log").read_text()[-2000:]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


# ---- scaling ------------------------------------------------------------------------------------


def test_scaling_table_and_plot_label_measured_and_simulated_rows(tmp_path):
    from orchestrator.observe.scaling import MEASURED, SIMULATED, measured_rows, simulated_rows, table, write

    measured = measured_rows([H200X2.parent])
    assert [(r.layout, r.gpus, r.source) for r in measured] == [("1PxTP1/1DxTP1", 2, MEASURED),
                                                                  ("agg:1AxTP1+1AxTP1", 2, MEASURED)]
    assert measured[0].total_tok_s == pytest.approx(13046.38, abs=0.01) and measured[0].origin.startswith(str(H200X2))
    simulated = simulated_rows([REPO / "configs/h200-1p1d-tp8.yaml", REPO / "configs/h100-2p1d-tp4.yaml"], (2, 4),
                               synthetic=True)
    by_layout = {(r.gpu, r.layout): r for r in simulated}
    assert {r.source for r in simulated} == {SIMULATED}
    assert by_layout[("H200", "1PxTP8/1DxTP8")].gpus == 16 and by_layout[("H200", "2PxTP8/2DxTP8")].gpus == 32
    assert by_layout[("H200", "2PxTP8/2DxTP8")].total_tok_s > 0
    assert "does not fit" in by_layout[("H100-SXM", "2PxTP4/1DxTP8")].note  # kept, labelled, not plotted
    text = table(measured + simulated)
    assert text.splitlines()[0].split()[:3] == ["source", "model", "gpu"]
    assert sum(line.startswith("measured") for line in text.splitlines()) == 2
    paths = write(measured + simulated, tmp_path)
    assert paths["png"].read_bytes().startswith(b"\x89PNG")
    rows = json.loads(paths["json"].read_text())
    assert {r["source"] for r in rows} == {MEASURED, SIMULATED} and all("per_gpu_tok_s" in r for r in rows)


def test_a_ray_jobs_runtime_env_values_never_reach_the_result():
    from orchestrator.observe.report import redacted_env

    job_config = json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_x.zip",
                                             "env_vars": {"HF_HUB_OFFLINE": "1", "MY_KEY": "s3cr3t-value"}},
                             "metadata": {"job_submission_id": "raysubmit_1"}})
    env = redacted_env({"RAY_JOB_CONFIG_JSON_ENV_VAR": job_config, "RAY_AUTH_TOKEN": "tok", "RAY_ADDRESS": "auto"})
    assert "s3cr3t-value" not in json.dumps(env) and env["RAY_AUTH_TOKEN"] == "<redacted>"
    recorded = json.loads(env["RAY_JOB_CONFIG_JSON_ENV_VAR"])
    assert recorded["runtime_env"]["env_vars"] == {"HF_HUB_OFFLINE": "<redacted>", "MY_KEY": "<redacted>"}
    assert recorded["runtime_env"]["working_dir"] == "gcs://_ray_pkg_x.zip" and env["RAY_ADDRESS"] == "auto"
    assert redacted_env({"RAY_JOB_CONFIG_JSON_ENV_VAR": "{not json"})["RAY_JOB_CONFIG_JSON_ENV_VAR"] == "<redacted>"


def test_a_ray_jobs_relative_result_dir_lands_in_the_result_root(monkeypatch, tmp_path):
    from orchestrator.run.bench_record import result_root

    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    monkeypatch.setenv("PD_ORCHESTRATOR_RESULT_ROOT", str(tmp_path))
    assert result_root("runs") == Path("runs")  # not a job: relative to the working directory, as before
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    assert result_root("runs") == tmp_path / "runs"
    assert result_root(tmp_path / "abs") == tmp_path / "abs"
    monkeypatch.delenv("PD_ORCHESTRATOR_RESULT_ROOT")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert result_root("runs") == tmp_path / "home" / "pd-orchestrator" / "runs"
