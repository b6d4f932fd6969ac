"""engines/sglang/log_phase: the phase a starting SGLang server is in, from its log (what a ready timeout names)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from orchestrator.engines.sglang.log_phase import startup_phase

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = ROOT / "benchmarks/results/2026-11-26-qwen3-serve-one-h100/prepare-call8.tar.xz"
MEMBER = "prepare/scrape/device-h100x1-qwen3-serve-set-bce5e0-prepare-43e093/decode-0-0.log"


@pytest.fixture(scope="module")
def decode_log() -> list[str]:
    """The one-H100 lease's cold Qwen3 decode start (call 8): weights, KV, 96 s of graph capture, warm-up, ready."""
    with tarfile.open(ARCHIVE) as tar:
        stream = tar.extractfile(MEMBER)
        assert stream is not None
        return stream.read().decode("utf-8", errors="replace").splitlines()


def _until(lines: list[str], needle: str) -> str:
    """The log as it stood right after the first line holding `needle`."""
    at = next(i for i, line in enumerate(lines) if needle in line)
    return "\n".join(lines[: at + 1])


@pytest.mark.parametrize("needle, phase", [
    ("server_args=ServerArgs(", "initialising torch distributed"),
    ("Load weight begin", "loading weights"),
    ("KV Cache is allocated", "allocating the memory pool"),
    ("Capture target decode CUDA graph begin", "capturing CUDA graphs"),
    ("Uvicorn running on", "running its own warm-up request"),
    ("fired up and ready to roll", "ready by its log, its readiness URLs not answering"),
])
def test_a_cut_log_names_the_phase_after_its_last_start_up_line(decode_log, needle, phase):
    assert startup_phase(_until(decode_log, needle)) == phase


def test_a_log_without_a_start_up_line_is_still_launching():
    assert startup_phase("") == "launching (no SGLang start-up line in its log yet)"
    assert startup_phase("Traceback (most recent call last):\n  File 'x'").startswith("launching")
