"""Every commit the docs and the results manifests cite is one a clone of main has: a helper's pre-rebase hash (its
branch commit before the rebase) resolves only in the checkout that made it. Such a citation names the rebased twin
(identical `git patch-id`) instead, or says plainly "pre-rebase" on the same line (manifests: git_commit_note)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a 7-12 or 40 hex-digit token with a digit and a letter (an all-digit one reads as a number); another repository's
# commit is written owner/repo@hash and is not ours to check; a file's digest ("sha256 d832bcff…") is not a commit
COMMIT = re.compile(r"(?<![0-9A-Za-z_/.@-])(?<!sha256 )(?<!sha256: )([0-9a-f]{7,12}|[0-9a-f]{40})(?![0-9A-Za-z_])")


def _commit_like(token: str) -> bool:
    return bool(re.search(r"[0-9]", token) and re.search(r"[a-f]", token))


@pytest.fixture(scope="module")
def history() -> set[str]:
    """Every prefix (7-12 digits) and full hash of the commits in HEAD's history; one git call."""
    shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], capture_output=True, text=True)
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("not a full git clone (shallow or no history): cited commits cannot be looked up")
    commits = subprocess.run(["git", "-C", str(ROOT), "rev-list", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.split()
    return {c[:n] for c in commits for n in range(7, 13)} | set(commits)


def test_every_commit_the_docs_cite_is_in_the_history(history: set[str]) -> None:
    """docs/*.md, README.md and every results folder's README.md."""
    unknown = []
    pages = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    for page in pages + sorted((ROOT / "benchmarks" / "results").glob("*/README.md")):
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for token in COMMIT.findall(line):
                if _commit_like(token) and token not in history and "pre-rebase" not in line:
                    unknown.append(f"{page.relative_to(ROOT)}:{number}: {token}")
    assert not unknown, ("commits not in main's history (name the rebased twin: the main commit with the same "
                         "`git patch-id --stable`, or say 'pre-rebase, not in history' on the line):\n" + "\n".join(unknown))


def test_every_results_manifest_commit_is_in_the_history_or_says_it_is_not(history: set[str]) -> None:
    unknown = []
    for path in sorted((ROOT / "benchmarks" / "results").glob("*/*manifest*.json")):
        manifest = json.loads(path.read_text())
        note = str(manifest.get("git_commit_note", ""))
        missing = [t for t in COMMIT.findall(str(manifest.get("git_commit", ""))) if _commit_like(t) and t not in history]
        if manifest.get("git_commit_recorded") and (missing or not note):
            unknown.append(f"{path.relative_to(ROOT)}: git_commit_recorded needs its twin in git_commit and a note")
        elif missing and not note.startswith("pre-rebase"):
            unknown.append(f"{path.relative_to(ROOT)}: git_commit {', '.join(missing)}")
    assert not unknown, ("manifests citing commits not in main's history (git_commit: the rebased twin, the pre-rebase "
                         "hash in git_commit_recorded; or git_commit_note 'pre-rebase, not in history: ...'):\n"
                         + "\n".join(unknown))
