"""The mem-fraction A/B's call script and its launch probe, without a GPU: the arms and rounds it accepts, the servers
it would start (only mem_fraction_static differs between the arms), and the probe's refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/device/eager_memfrac.sh"
PROBE = ROOT / "scripts/device/launch_probe.py"


def _run(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_an_unknown_phase_arm_or_fraction_is_refused_naming_the_fix() -> None:
    r = _run("lone")
    assert r.returncode == 2 and "stage|ab" in r.stderr
    r = _run("ab", ROUNDS="A,C", DRY_RUN="1")
    assert r.returncode == 2 and "'C'" in r.stderr and "ROUNDS=A,B,A,B" in r.stderr
    r = _run("ab", MEM_B="65", DRY_RUN="1")
    assert r.returncode == 2 and "MEM_A / MEM_B: '65'" in r.stderr


def test_the_dry_run_starts_a_fresh_server_per_round_differing_only_in_the_mem_fraction() -> None:
    r = _run("ab", DRY_RUN="1")
    assert r.returncode == 0, r.stderr
    starts = [line for line in r.stdout.splitlines() if "serve_direct.py start" in line]
    assert [line.split(":")[0] for line in starts] == ["round 0 A", "round 1 B", "round 2 A", "round 3 B"]
    assert ["mem_fraction_static=0.85" in s for s in starts] == [True, False, True, False]
    assert ["mem_fraction_static=0.65" in s for s in starts] == [False, True, False, True]
    argv = {s.split(":", 1)[1].split(" (PDO_STEP_PROBE")[0].replace("0.85", "X").replace("0.65", "X") for s in starts}
    assert len(argv) == 1
    assert r.stdout.count("--new-tokens 160 --no-warmup") == 4
    warm = _run("ab", DRY_RUN="1", WARMUP_ROUNDS="0", NEW_TOKENS="300").stdout
    assert warm.count("--no-warmup") == 3 and "--new-tokens 300;" in warm


def test_stage_without_a_carried_piece_fails(tmp_path) -> None:
    (tmp_path / "scripts/device").mkdir(parents=True)
    (tmp_path / "scripts/device/eager_modes.sh").write_bytes((ROOT / "scripts/device/eager_modes.sh").read_bytes())
    r = _run("stage", cwd=tmp_path, STAGE7=str(tmp_path / "stage"))
    assert r.returncode == 1 and "staged 0 piece(s)" in r.stdout


def test_the_launch_probe_refuses_a_cpu_it_may_not_run_on() -> None:
    bad = max(os.sched_getaffinity(0)) + 1
    r = subprocess.run([sys.executable, str(PROBE), "--cpu", str(bad), "--out", "/dev/null"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and f"--cpu {bad}: not among this process's CPUs" in r.stderr
    r = subprocess.run([sys.executable, str(PROBE), "--cpu", "0", "--launches", "0", "--out", "/dev/null"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--launches 0" in r.stderr
