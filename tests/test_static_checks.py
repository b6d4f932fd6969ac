"""The code passes its linter (ruff) and type checker (mypy), both configured in pyproject.toml.

They run as part of the test command, so a fresh clone's CI fails on an unused import, a name that does not
exist, a closure over a loop variable, an Optional used as if always set, or a call with the wrong arguments.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINTED = ["orchestrator", "deployments", "benchmarks", "scripts", "tests", "dashboards"]
TYPE_CHECKED = ["orchestrator", "deployments", "benchmarks", "scripts"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=900)


def test_ruff_finds_nothing():
    out = _run("ruff", "check", "--no-cache", "--output-format", "concise", *LINTED)
    assert out.returncode == 0, f"ruff check {' '.join(LINTED)}:\n{out.stdout}{out.stderr}"


def test_mypy_finds_nothing():
    # The cache lives outside the checkout (one per checkout path): a second run takes seconds, not a minute.
    cache = Path(tempfile.gettempdir()) / f"pdo-mypy-{hashlib.sha1(str(REPO).encode()).hexdigest()[:8]}"
    out = _run("mypy", "--cache-dir", str(cache), *TYPE_CHECKED)
    assert out.returncode == 0, f"mypy {' '.join(TYPE_CHECKED)}:\n{out.stdout}{out.stderr}"
