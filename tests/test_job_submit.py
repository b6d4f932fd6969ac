"""`ray job submit --working-dir . -- python -m orchestrator bench ...` against a running local cluster:
a VALID run exits 0 (as the job's real status says through the SDK) and writes its result; an INVALID
run exits non-zero and prints the reason as the last line of the job log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from orchestrator.config import dump_config

pytestmark = pytest.mark.ray
REPO = Path(__file__).resolve().parent.parent
UPLOAD_EXCLUDES = [".venv*/", ".device/", "build/", "runs/", ".hypothesis/", "*.egg-info/"]


def _submit(dashboard_url: str, config_path: Path, *bench_args: str) -> tuple[str, subprocess.CompletedProcess]:
    job_id = f"pdo-test-{uuid.uuid4().hex[:8]}"
    ray = str(Path(sys.executable).parent / "ray")
    argv = [
        ray, "job", "submit", "--address", dashboard_url, "--working-dir", str(REPO), "--submission-id", job_id,
        # Ray reads .gitignore files but not .git/info/exclude; keep local venvs/build output out of the upload
        "--runtime-env-json", json.dumps({"excludes": UPLOAD_EXCLUDES}),
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
