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
    done = _lease(tmp_path, "serve-layers", DRY_RUN="1", LAYERS_GPU0="6", LAYERS_GPU1="12 9", PROBE_TAG="lease13")
    assert done.returncode == 0, done.stderr
    assert "CONC=4,16,32 BUDGET=400 bash scripts/device/serve_two_gpu.sh serve" in done.stdout
    assert [line for line in done.stdout.splitlines() if line.startswith("== ")] == [
        "== q3l6-lease13: 6 layers (0 dense + 6 MoE), cold caches", "== q3l12-lease13: 12 layers (0 dense + 12 MoE), cold caches",
        "== q3l9-lease13: 9 layers (0 dense + 9 MoE), warm caches"]


def test_the_layer_phases_refuse_a_call_without_a_probe_tag(tmp_path) -> None:
    for phase in ("serve-layers", "layers"):
        done = _lease(tmp_path, phase, DRY_RUN="1", PROBE_TAG="")
        assert done.returncode == 2 and "PROBE_TAG is not set" in done.stderr, done.stderr


def test_an_unknown_phase_is_refused_naming_the_phases(tmp_path) -> None:
    done = _lease(tmp_path, "serve")
    assert done.returncode == 2 and "unknown phase 'serve' (stage|join|prepare|serve-layers|layers)" in done.stderr


def test_stage_refuses_a_call_that_carried_nothing(tmp_path) -> None:
    done = _lease(tmp_path, "stage")
    assert done.returncode == 1 and "staged 0 file(s)" in done.stdout


def test_pieces_staged_over_calls_are_joined_once_all_are_there_and_a_wrong_sha256_is_refused(tmp_path) -> None:
    """Three calls of one machine, each carrying one piece: the blob (sglang tree + runtime + wheel, pieces_lib.sh) and
    AIPerf's two parts come back whole where serve_one_gpu.sh reads them."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "scripts").symlink_to(ROOT / "scripts")
    blob = tmp_path / "blob"
    blob.mkdir()
    for name, text in (("site.tar.xz", "site"), ("runtime.tar.xz", "rt"), ("httptools-0.9.0-x.whl", "w")):
        (blob / name).write_text(text)
    archive = subprocess.run(["tar", "-C", str(blob), "-cf", "-", "site.tar.xz", "runtime.tar.xz", "httptools-0.9.0-x.whl"],
                             capture_output=True, check=True).stdout
    aiperf = b"aiperf-bytes"
    carried = {".device/lease10/blob.part00": archive[:5000], ".device/lease10/blob.part01": archive[5000:],
               ".device/aiperf-split/aiperf.part00": aiperf[:6], ".device/aiperf-split/aiperf.part01": aiperf[6:]}
    digest = subprocess.run(["sha256sum"], input=aiperf, capture_output=True, check=True).stdout.split()[0].decode()

    def call(phase: str, *pieces: str, **env: str) -> subprocess.CompletedProcess:
        for old in (repo / ".device").glob("*/*.part*"):
            old.unlink()
        for piece in pieces:
            (repo / piece).parent.mkdir(parents=True, exist_ok=True)
            (repo / piece).write_bytes(carried[piece])
        full = {**os.environ, "OUT": str(tmp_path / "out"), **{k: str(tmp_path / k.lower()) for k in
                ("STAGE7", "RT_STAGE", "AIPERF_STAGE", "SITE_STAGE")}, **env}
        return subprocess.run(["bash", "scripts/device/qwen3_pair_lease.sh", phase], capture_output=True, text=True,
                              cwd=repo, env=full)

    assert call("stage", ".device/lease10/blob.part00", ".device/aiperf-split/aiperf.part00").returncode == 0
    first = call("join", ".device/lease10/blob.part01")
    assert "aiperf.tar.xz: 1 of 2 pieces staged so far" in first.stdout
    assert (repo / ".device/rt/runtime.tar.xz").read_text() == "rt" and (repo / ".device/rt/whl/httptools-0.9.0-x.whl").exists()
    assert not (repo / ".device/aiperf/aiperf.tar.xz").exists()
    wrong = call("join", ".device/aiperf-split/aiperf.part01", AIPERF_SHA256="0" * 64)
    assert wrong.returncode == 1 and "expected " + "0" * 64 in wrong.stdout
    right = call("join", ".device/aiperf-split/aiperf.part01", AIPERF_SHA256=digest)
    assert right.returncode == 0 and (repo / ".device/aiperf/aiperf.tar.xz").read_bytes() == aiperf
