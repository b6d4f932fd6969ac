"""Offline benchmark: SGLang's result block byte for byte, counts that add up, deadline verdicts, the JSON
result, and (with the router and sim engine) a small end-to-end run on the session Ray cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.observe.report import PhaseTime, RunVerdict, ThroughputSummary, redacted_env, result_block
from orchestrator.records import BenchRequest, RequestResult
from orchestrator.run.bench import run_bench
from orchestrator.run.driver import complete_results
from orchestrator.workload.batch import order_requests, warmup_batch

EXPECTED_BLOCK = (
    "\n"
    "====== Offline Throughput Benchmark Result =======\n"
    "Backend:                                 engine    \n"
    "Successful requests:                     2         \n"
    "Benchmark duration (s):                  4.00      \n"
    "Total input tokens:                      300       \n"
    "Total generated tokens:                  50        \n"
    "Last generation throughput (tok/s):      12.35     \n"
    "Request throughput (req/s):              0.50      \n"
    "Input token throughput (tok/s):          75.00     \n"
    "Output token throughput (tok/s):         12.50     \n"
    "Total token throughput (tok/s):          87.50     \n"
    "=================================================="
)


def _results() -> list[RequestResult]:
    return [
        RequestResult(index=0, status="ok", prompt_len=100, output_len=30, completion_tokens=30),
        RequestResult(index=1, status="ok", prompt_len=200, output_len=25, completion_tokens=20),
        RequestResult(index=2, status="failed", prompt_len=999, output_len=99, error="decode leg: 503"),
    ]


def test_block_matches_sglang_format_and_definitions():
    summary = ThroughputSummary.from_results(_results(), duration_s=4.0, last_gen_throughput=12.345)
    # input = client prompt lengths, output = server completion tokens, both over completed requests only
    assert result_block(summary) == EXPECTED_BLOCK


def test_missing_results_fail_with_the_reason_and_counts_add_up():
    requests = [BenchRequest(index=i, input_ids=[1] * (i + 2), output_len=4) for i in range(5)]
    got = {0: _results()[0], 3: RequestResult(index=3, status="ok", prompt_len=5, output_len=4, completion_tokens=4)}
    results = complete_results(requests, got, "router stream failed: boom")
    assert [r.index for r in results] == [0, 1, 2, 3, 4]
    failed = [r for r in results if r.status == "failed"]
    assert len(failed) + sum(r.status == "ok" for r in results) == len(requests)
    assert {r.error for r in failed} == {"router stream failed: boom"}
    assert [r.prompt_len for r in failed] == [3, 4, 6]


def _verdict(**kw) -> RunVerdict:
    base = dict(engine="sim", layout="1P/1D", deadline_s=420, total_s=100.0,
                phases=[PhaseTime("placement", 0, 10)], num_prompts=2, completed=2, failed=0)
    return RunVerdict(**{**base, **kw})


def test_verdict_is_valid_only_within_deadline_with_every_prompt_done():
    assert _verdict().verdict == "VALID"
    assert _verdict(total_s=421).why_invalid() == "took 421.0s, over the 420s deadline"
    assert _verdict(completed=1, failed=1).why_invalid() == "1 of 2 prompts failed"
    assert _verdict(reason="interrupted during measured run: SIGTERM").why_invalid().startswith("interrupted")


def test_secrets_in_env_are_redacted():
    env = redacted_env({"RAY_AUTH_TOKEN": "s3cret", "HF_TOKEN": "x", "RAY_ADDRESS": "http://h:1", "HOME": "/r"})
    assert env == {"HF_TOKEN": "<redacted>", "RAY_ADDRESS": "http://h:1", "RAY_AUTH_TOKEN": "<redacted>"}


def test_dataset_warmup_is_batch_shaped_but_short_and_never_collides_with_the_batch(make_sim_config):
    from orchestrator.workload.dataset import sample_sharegpt
    from orchestrator.workload.tokenizer import load_tokenizer

    cfg = make_sim_config(overrides={"benchmark.num_prompts": 64,
                                     "benchmark.warmup": {"policy": "dataset", "num_prompts": 8, "max_output_len": 12}})
    warm = warmup_batch(cfg, batch_size=64)
    measured = sample_sharegpt(load_tokenizer(cfg.model.path), 64, cfg.benchmark.seed, cfg.benchmark.dataset_path)
    assert [r.index for r in warm] == list(range(64, 72))  # the first forwards' prompts go straight to the servers
    assert all(1 <= r.output_len <= 12 for r in warm)
    assert max(r.prompt_len for r in warm[:8]) > 12, "warm-up prompts should be ShareGPT-sized, not toy prompts"
    assert not {tuple(r.input_ids) for r in warm} & {tuple(p.to_request().input_ids) for p in measured}


def test_the_dataset_warmup_runs_the_runs_first_forward_a_full_chunk_on_every_dp_rank(make_sim_config):
    # every batch run starts with a full chunk of one sequence; a warm-up without one leaves that forward's kernels
    # to compile inside the measured run on cold caches (2.0-2.7 s in three PD runs)
    from orchestrator.perfmodel.costmodel import cost_model_for
    from orchestrator.workload.batch import bench_first_forwards, first_forward_ids

    cfg = make_sim_config(overrides={"benchmark.num_prompts": 64, "benchmark.warmup": {"policy": "dataset",
                                                                                         "num_prompts": 8}},
                          prefill=[{"count": 1, "tp": 1}, {"count": 2, "tp": 4, "dp": 2, "dp_attention": True}])
    chunk = cost_model_for(cfg, "prefill", cfg.layout.prefill[0]).chunked_prefill_tokens
    first = bench_first_forwards(cfg)
    assert [(f.group_index, f.chunk_tokens, f.ranks) for f in first] == [(0, chunk, 1), (1, chunk // 2, 2)]
    assert all(f.prompt_len == f.chunk_tokens + 64 for f in first)
    warm = warmup_batch(cfg, batch_size=64)
    assert sum(r.prompt_len for r in warm) < chunk, "the short prompts alone never fill a chunk"
    ids = [first_forward_ids(warm, first[1].prompt_len, rank) for rank in range(2)]
    assert all(len(i) == first[1].prompt_len for i in ids)
    # no head is a warm-up prompt's, nor the other rank's: a prefix-cache hit would cut the first forward short
    heads = {tuple(i[:16]) for i in ids} | {tuple(r.input_ids[:16]) for r in warm}
    assert len(heads) == 2 + len(warm)
    assert bench_first_forwards(cfg.model_copy(update={"benchmark": cfg.benchmark.model_copy(update={
        "warmup": cfg.benchmark.warmup.model_copy(update={"policy": "sglang"})})})) == []


def test_interleave_ordering_keeps_every_request_once():
    reqs = [BenchRequest(index=i, input_ids=[1] * (i + 1), output_len=1) for i in range(7)]
    out = order_requests(reqs, "interleave")
    assert sorted(r.index for r in out) == list(range(7))
    assert [r.index for r in out[:3]] == [6, 0, 5]


def test_failed_placement_gives_invalid_result_with_reason_and_json(make_sim_config, tmp_path):
    """Preflight refusal needs no cluster: the result is INVALID, written, every prompt accounted for."""
    cfg = make_sim_config(overrides={"model.preset": "DeepSeek-R1", "model.quantization": "bf16",
                                     "cluster.gpu": "H100-SXM", "engine.sim.profile": "H100-SXM"})
    result = run_bench(cfg, quiet=True, num_prompts=4)
    assert not result.valid
    assert result.verdict.why_invalid().startswith("memory preflight:")
    data = json.loads(result.result_path.read_text())
    assert data["verdict"] == "INVALID" and data["counts"]["num_prompts"] == 4
    assert data["counts"]["completed"] + data["counts"]["failed"] == 4
    assert "pass --force to run anyway" in data["reason"].splitlines()[0]


PREFILL_LINE = re.compile(r"Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)")


@pytest.mark.ray
def test_small_benchmark_end_to_end(ray_driver, make_sim_config, tmp_path):
    # two prefill servers, a dataset warm-up: every prefill's first forward after start-up is the run's first
    # forward (one sequence of exactly its chunk), before any short warm-up prompt; none of the warm-up in results
    cfg = make_sim_config(prefill=[{"count": 2, "tp": 2, "chunked_prefill_size": 2048}], decode=[{"count": 1, "tp": 2}],
                          overrides={"benchmark.warmup": {"policy": "dataset", "num_prompts": 4}})
    result = run_bench(cfg, quiet=True, num_prompts=12)
    text = result.text()
    assert "====== Offline Throughput Benchmark Result =======" in text
    assert result.verdict.completed + result.verdict.failed == 12
    assert result.valid, result.verdict.why_invalid()
    data = json.loads(result.result_path.read_text())
    assert len(data["results"]) == 12
    assert data["summary"]["successful_requests"] == 12
    assert data["summary"]["total_input_tokens"] == sum(r["prompt_len"] for r in data["results"])
    assert data["summary"]["total_output_tokens"] == sum(r["completion_tokens"] for r in data["results"])
    assert [p["name"] for p in data["phases"]][:4] == ["preflight", "dataset", "placement", "engine start"]
    # placement's steps, one after the other, fill the phase (the session's cluster is up: no raylet starts)
    placement = next(p for p in data["phases"] if p["name"] == "placement")
    steps = data["metadata"]["placement_steps"]
    assert [s["name"] for s in steps] == ["imports", "driver attach", "nodes + registry", "scrape targets", "serve start", "replicas"]
    assert all(a["end_s"] == b["start_s"] for a, b in zip(steps, steps[1:]))
    assert steps[0]["start_s"] == pytest.approx(placement["start_s"], abs=0.05)
    assert steps[-1]["end_s"] == pytest.approx(placement["end_s"], abs=0.5)  # the driver's exporter starts after
    assert {w["role"] for w in data["metadata"]["workers"]} == {"prefill", "decode"}
    assert all(r["prefill_worker"] and r["decode_worker"] for r in data["results"])
    assert {r["index"] for r in data["results"]} == set(range(12)), "warm-up requests never enter the results"
    for r in data["results"]:  # the router's own stamps of both legs, on sent_at's clock
        for leg in ("prefill", "decode"):
            assert r["sent_at"] <= r[f"{leg}_posted_at"] <= r[f"{leg}_first_byte_at"] <= r["done_at"], (leg, r)
    prefills = [w for w in data["metadata"]["workers"] if w["role"] == "prefill"]
    assert len(prefills) == 2
    for w in prefills:
        forwards = [tuple(map(int, m.groups())) for m in PREFILL_LINE.finditer(Path(w["log_path"]).read_text())]
        assert forwards[0] == (1, 2048, 0), (w["name"], forwards[:4])  # the long prompt's first chunk, alone
        assert forwards[1][1] == 64, (w["name"], forwards[:4])  # its remainder, before any short prompt
    # the phases count from metadata.started_at: the first prompt left when the measured run began
    run_phase = next(p for p in data["phases"] if p["name"] == "measured run")
    first_sent = min(r["sent_at"] for r in data["results"])
    scale = data["metadata"]["time_scale"]
    assert first_sent - data["metadata"]["started_at"] == pytest.approx(run_phase["start_s"] * scale, abs=0.5)


def test_failures_are_grouped_by_reason_with_times_blanked():
    from orchestrator.observe.report import failure_reasons

    errors = ["timeout: decode d/0: no answer within 222.5s", "timeout: decode d/0: no answer within 9s",
              "http_400: prefill p/0: bad input_ids"]
    results = [RequestResult(index=i, status="failed", prompt_len=1, output_len=1, error=e) for i, e in enumerate(errors)]
    assert failure_reasons(results) == {"timeout: decode d/0: no answer within <t>s": 2,
                                        "http_400: prefill p/0: bad input_ids": 1}


@pytest.mark.ray
def test_sigterm_writes_partial_invalid_result_and_tears_down(ray_cluster, make_sim_config, tmp_path):
    """SIGTERM (what `ray job stop` sends) while engines start: INVALID result with the reason, exit 1,
    no worker replica left on the cluster."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from ray.util.state import list_actors

    from orchestrator.config import dump_config
    from tests.support import wait_until

    cfg = make_sim_config(overrides={"engine.sim.startup_s": 600.0})  # engines never get ready in time
    config_path = tmp_path / "sigterm.yaml"
    config_path.write_text(dump_config(cfg))
    log_path = tmp_path / "bench.log"
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.gcs_address, "RAY_AUTH_MODE": "disabled"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "bench", "--config", str(config_path),
                                 "--num-prompts", "4"], cwd=Path(__file__).resolve().parents[2],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(lambda: "engine start ..." in log_path.read_text(), timeout_s=240)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 1  # teardown (serve.shutdown) is slow on a loaded box
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log_path.read_text()
    assert out.strip().splitlines()[-1] == "INVALID: interrupted during engine start: received SIGTERM"
    data = json.loads(next(tmp_path.glob("*/result.json")).read_text())
    assert data["verdict"] == "INVALID" and data["counts"] == {"num_prompts": 4, "completed": 0, "failed": 4}
    assert {r["error"] for r in data["results"]} == {"not run: interrupted during engine start: received SIGTERM"}
    replicas = [a for a in list_actors(address=ray_cluster.dashboard_url, filters=[("state", "=", "ALIVE")], limit=1000)
                if a.class_name.startswith("ServeReplica:workers-")]
    assert replicas == []
