"""Lease 11's device script (scripts/device/qwen3_pair_lease.sh) without a GPU: its phases, the layer counts each GPU
takes, and a stage call that copies the carried pieces where the later calls assemble them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/device/qwen3_pair_lease.sh"


def _lease(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    stages = {k: str(tmp_path / k.lower()) for k in ("STAGE7", "RT_STAGE", "AIPERF_STAGE", "SITE_STAGE")}
    full = {**os.environ, "OUT": str(tmp_path / "out"), **stages, **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, env=full)


def test_dry_run_names_each_phase_and_one_count_list_per_gpu(tmp_path) -> None:
    done = _lease(tmp_path, "serve-layers", DRY_RUN="1", LAYERS_GPU0="6", LAYERS_GPU1="12 9")
    assert done.returncode == 0, done.stderr
    assert "CONC=4,16,32 BUDGET=400 bash scripts/device/serve_two_gpu.sh serve" in done.stdout
    assert [line for line in done.stdout.splitlines() if line.startswith("== ")] == [
        "== q3l6: 6 layers (0 dense + 6 MoE), cold caches", "== q3l12: 12 layers (0 dense + 12 MoE), cold caches",
        "== q3l9: 9 layers (0 dense + 9 MoE), warm caches"]


def test_an_unknown_phase_is_refused_naming_the_phases(tmp_path) -> None:
    done = _lease(tmp_path, "serve")
    assert done.returncode == 2 and "unknown phase 'serve' (stage|prepare|serve-layers|layers)" in done.stderr


def test_stage_refuses_a_call_that_carried_nothing(tmp_path) -> None:
    done = _lease(tmp_path, "stage")
    assert done.returncode == 1 and "staged 0 file(s)" in done.stdout
