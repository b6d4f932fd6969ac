"""`ray job submit --working-dir . -- python -m orchestrator bench ...` against a running local cluster:
a VALID run exits 0 (as the job's real status says through the SDK) and writes its result; an INVALID
run exits non-zero and prints the reason as the last line of the job log."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from orchestrator.config import dump_config
from tests.support import engine_metric, sim_config, sim_engines_finished, wait_until

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parents[2]
UPLOAD_EXCLUDES = [".venv*/", ".device/", "build/", "runs/", ".hypothesis/", "*.egg-info/"]


def _submit(dashboard_url: str, config_path: Path, *bench_args: str,
            wait: bool = True) -> tuple[str, subprocess.CompletedProcess]:
    job_id = f"pdo-test-{uuid.uuid4().hex[:8]}"
    ray = str(Path(sys.executable).parent / "ray")
    argv = [
        ray, "job", "submit", "--address", dashboard_url, "--working-dir", str(REPO), "--submission-id", job_id,
        # Ray reads .gitignore files but not .git/info/exclude; keep local venvs/build output out of the upload
        "--runtime-env-json", json.dumps({"excludes": UPLOAD_EXCLUDES}), *([] if wait else ["--no-wait"]),
        "--", sys.executable, "-m", "orchestrator", "bench", "--config", str(config_path), "--quiet", *bench_args,
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    return job_id, subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=400, env=env)


def _job_info(dashboard_url: str, job_id: str):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(dashboard_url).get_job_info(job_id)


def test_valid_bench_job_exits_zero_and_writes_the_block(ray_cluster, make_sim_config, tmp_path):
    cfg = make_sim_config()
    config_path = tmp_path / "job.yaml"
    config_path.write_text(dump_config(cfg))
    job_id, proc = _submit(ray_cluster.dashboard_url, config_path, "--num-prompts", "8")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    info = _job_info(ray_cluster.dashboard_url, job_id)
    assert info.status == "SUCCEEDED" and info.driver_exit_code == 0
    assert "====== Offline Throughput Benchmark Result =======" in proc.stdout
    assert "Successful requests:                     8" in proc.stdout
    results = list(tmp_path.glob("*/result.json"))
    assert len(results) == 1
    data = json.loads(results[0].read_text())
    assert data["verdict"] == "VALID" and data["counts"] == {"num_prompts": 8, "completed": 8, "failed": 0}
    # the job attached to the running cluster rather than starting its own
    assert not (tmp_path / "local-cluster.json").exists()


def test_invalid_bench_job_fails_and_prints_the_reason_last(ray_cluster, make_sim_config, tmp_path):
    cfg = make_sim_config(overrides={"cluster.gpu": "H100-SXM", "model.quantization": "bf16"})
    config_path = tmp_path / "job.yaml"
    config_path.write_text(dump_config(cfg))
    job_id, proc = _submit(ray_cluster.dashboard_url, config_path, "--num-prompts", "4")
    assert proc.returncode != 0
    assert "INVALID: memory preflight:" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    info = _job_info(ray_cluster.dashboard_url, job_id)
    assert info.status == "FAILED" and info.driver_exit_code == 1
    assert "INVALID: memory preflight:" in proc.stdout
    from ray.job_submission import JobSubmissionClient

    job_log = JobSubmissionClient(ray_cluster.dashboard_url).get_job_logs(job_id)
    assert job_log.strip().splitlines()[-1].startswith("INVALID: memory preflight:")


def _readme_job_lines() -> tuple[str, str]:
    """The `cluster up` and `ray job submit` lines of the README's "Through `ray job submit`" block, as printed."""
    text = (REPO / "README.md").read_text()
    block = text.split("### Through `ray job submit`", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]
    up = next(line for line in lines if " cluster up " in f" {line} ")
    submit = next(line for line in lines if " job submit " in f" {line} ")
    return up, submit


def _checkout_copy(dest: Path) -> None:
    """What `--working-dir .` would upload from this checkout (files git does not ignore, as they are now),
    with the venv linked in: a user's clone."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    (dest / ".venv").symlink_to(Path(sys.prefix))


def test_readme_job_submit_line_works_as_printed_and_the_result_stays(tmp_path):
    """The README's own `cluster up` and `ray job submit ... -- python -m orchestrator bench ...` lines, run
    from a copy of the checkout whose shell does NOT have .venv/bin on PATH (a fresh login). The copy's
    configs/default.yaml is a small sim config (8 prompts) so the test stays short; the command lines are
    the README's, character for character."""
    up_line, submit_line = _readme_job_lines()
    assert submit_line.startswith(".venv/bin/ray --logging-level warning job submit")
    assert " python -m orchestrator bench " in submit_line
    home = tmp_path / "checkout"
    _checkout_copy(home)
    cfg = sim_config(overrides={"name": "default", "benchmark.num_prompts": 8, "benchmark.result_dir": "runs"})
    (home / "configs" / "default.yaml").write_text(dump_config(cfg))
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", os.defpath).split(os.pathsep)
                           if p and Path(p).resolve() != Path(venv_bin).resolve())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VIRTUAL_ENV", "PD_ORCHESTRATOR"))}
    env.update(PATH=path, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    up = subprocess.run(["bash", "-c", up_line], cwd=home, env=env, capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        export = next(line for line in up.stdout.splitlines() if line.startswith("export RAY_API_SERVER_ADDRESS="))
        env["RAY_API_SERVER_ADDRESS"] = export.split()[1].split("=", 1)[1]
        job = subprocess.run(["bash", "-c", submit_line], cwd=home, env=env, capture_output=True, text=True,
                             timeout=600)
    finally:
        subprocess.run(["bash", "-c", up_line.replace(" up --local", " down")], cwd=home, env=env,
                       capture_output=True, text=True, timeout=120)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out[-4000:]
    assert "No module named" not in out
    # the result is in the checkout the cluster was started from (README), not in the job's temp dir
    results = list((home / "runs").glob("default-*/result.json"))
    assert len(results) == 1, out[-3000:]
    data = json.loads(results[0].read_text())
    assert data["verdict"] == "VALID" and data["counts"]["completed"] == 8
    assert f"result: {results[0]}" in out
    # a clean run prints nothing alarming
    assert "killed by `ray.kill`" not in out and "Traceback" not in out
    assert out.count("ShareGPT ") <= 1
    # nor noise: Ray's upload packing per .gitignore, a Serve object's repr, Serve's start-up chatter
    assert "Ignoring upload" not in out and " object at 0x" not in out
    assert "Started Serve in namespace" not in out and "Connecting to existing Serve app" not in out


def test_ray_job_stop_mid_run_keeps_every_finished_prompt(ray_driver, make_sim_config, tmp_path):
    """`ray job stop` (SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S) during the measured run: the job's
    result.json keeps every prompt the decode engine finished, the rest fail naming the phase and the signal,
    and the run tore down (its HTML report written: the clusters we start give a job time to finish that)."""
    import ray
    from ray.job_submission import JobStatus, JobSubmissionClient

    from orchestrator.cluster.registry import get_registry

    num_prompts = 200  # ~tens of seconds at time_scale 20: the stop surely lands mid-run
    cfg = make_sim_config(overrides={"name": "jobstop", "engine.sim.time_scale": 20.0,
                                     "benchmark.num_prompts": num_prompts, "benchmark.max_in_flight": 16,
                                     "benchmark.deadline_s": 60.0, "metrics.exporter_port": 0,
                                     "metrics.file_sd_path": str(tmp_path / "targets.json")})
    config_path = tmp_path / "job.yaml"
    config_path.write_text(dump_config(cfg))
    job_id, proc = _submit(ray_driver.dashboard_url, config_path, wait=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    client = JobSubmissionClient(ray_driver.dashboard_url)

    def decode_finished() -> float:
        if client.get_job_status(job_id).is_terminal():
            raise AssertionError(f"the job ended before the stop:\n{client.get_job_logs(job_id)[-3000:]}")
        _, endpoints = ray.get(get_registry().snapshot.remote())
        return sum(engine_metric(e.url, "sglang:num_requests_total") or 0 for e in endpoints if e.role == "decode")

    wait_until(lambda: decode_finished() >= 4, 180, 0.1, "the job's decode engine to finish a few requests")
    # the job keeps Prometheus's targets file current: both engines, the router replica and the driver
    listed = json.loads((tmp_path / "targets.json").read_text())
    assert {g["labels"].get("role") or g["labels"]["component"].split("-")[0] for g in listed} == {
        "prefill", "decode", "router", "driver"}, listed
    ray_cli = str(Path(sys.executable).parent / "ray")
    stop = subprocess.run([ray_cli, "job", "stop", "--address", ray_driver.dashboard_url, job_id],
                          capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    wait_until(lambda: client.get_job_status(job_id).is_terminal(), 60, 0.2, "the job to stop")
    assert client.get_job_status(job_id) == JobStatus.STOPPED
    log = client.get_job_logs(job_id)

    results = list(tmp_path.glob("*/result.json"))
    assert len(results) == 1, log[-3000:]
    doc = json.loads(results[0].read_text())
    counts = doc["counts"]
    assert doc["verdict"] == "INVALID" and "interrupted during measured run: received SIGTERM" in doc["reason"]
    engine_finished = sim_engines_finished(doc, "decode")
    print(f"KEPT ray job stop: result.json completed {counts['completed']} / failed {counts['failed']} of "
          f"{num_prompts}; the decode engine's own tally: {engine_finished} finished (not aborted); "
          f"job {client.get_job_info(job_id).status}")
    assert counts["completed"] > 0, f"the prompts finished before the stop were dropped: {counts}"
    assert counts["completed"] == engine_finished, log[-3000:]
    assert counts["completed"] + counts["failed"] == num_prompts
    assert all("interrupted during measured run: received SIGTERM" in r["error"]
               for r in doc["results"] if r["status"] == "failed")
    assert (results[0].parent / "report.html").exists(), f"teardown did not finish before SIGKILL:\n{log[-3000:]}"
    assert json.loads((tmp_path / "targets.json").read_text()) == [], "the stopped run's targets are still listed"
    assert log.strip().splitlines()[-1] == "INVALID: interrupted during measured run: received SIGTERM", log[-3000:]
