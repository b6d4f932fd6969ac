"""Lease 9's call script, dry (no GPU): it checks its phase, stages carried pieces through eager_profile.sh, and
benches the one-GPU PD config whose warm-up holds the full-chunk prompt the pre-registration reads."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/device/warmup_fix.sh"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_an_unknown_phase_is_refused_with_the_phases_named() -> None:
    r = _run("warm")
    assert r.returncode == 2 and "stage|pd" in r.stderr


def test_the_dry_run_benches_the_one_gpu_pd_config_with_force() -> None:
    r = _run("pd", DRY_RUN="1")
    assert r.returncode == 0, r.stderr
    assert "configs/device-h100x1-1p1d.yaml" in r.stdout and "--force" in r.stdout


def test_stage_without_a_carried_piece_fails(tmp_path) -> None:
    r = subprocess.run(["bash", str(SCRIPT), "stage"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "STAGE7": str(tmp_path / "stage")})
    assert r.returncode == 1 and "staged 0 piece(s)" in r.stdout


def test_the_config_s_warm_up_runs_a_full_chunk_before_the_run() -> None:
    from orchestrator.config.load import load_config
    from orchestrator.workload.batch import bench_first_forwards

    cfg = load_config(ROOT / "configs/device-h100x1-1p1d.yaml")
    assert cfg.benchmark.warmup.policy == "dataset"
    assert max(f.prompt_len for f in bench_first_forwards(cfg)) >= 8192
