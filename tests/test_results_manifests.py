"""Every results folder says what ran, at which commit, on which machine (manifest.json), and the tools write it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.provenance import MANIFEST_KEYS, folder_problems, manifest_problems, write_manifest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted(p for p in (ROOT / "benchmarks" / "results").iterdir() if p.is_dir())
FIX = "python3 benchmarks/manifest.py write --out DIR --command '...'"


@pytest.mark.parametrize("folder", RESULTS, ids=[p.name for p in RESULTS])
def test_every_results_folder_has_a_complete_manifest(folder: Path) -> None:
    problems = folder_problems(folder)
    assert not problems, "\n".join(problems) + f"\nfix: {FIX} (or fill the keys by hand: {', '.join(MANIFEST_KEYS)})"


GOOD = {"command": "x", "git_commit": "c69346f", "git_dirty": False, "machine": "vm", "gpu": "none",
        "packages": {"python": "3.11.7"}, "started_at": "2026-11-26T04:00:00Z"}


@pytest.mark.parametrize("change, complaint", [
    ({"gpu": None}, "gpu: empty"),
    ({"packages": {}}, "packages: empty"),
    ({"command": "  "}, "command: empty"),
    ({"git_commit": "HEAD"}, "neither a commit hash"),
    ({"started_at": "this morning"}, "not an ISO date"),
    ({"git_dirty": 0.5}, "git_dirty"),
])
def test_the_check_names_what_is_wrong(change: dict, complaint: str) -> None:
    assert manifest_problems(GOOD) == []
    problems = manifest_problems(GOOD | change)
    assert any(complaint in p for p in problems), problems


def test_the_check_wants_every_key() -> None:
    for key in MANIFEST_KEYS:
        document = {k: v for k, v in GOOD.items() if k != key}
        assert manifest_problems(document) == [f"{key}: missing"]
    assert manifest_problems(GOOD | {"git_commit": "unknown (reconstructed)"}) == []


def test_written_manifest_records_the_commit_that_ran_and_a_dirty_tree(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("PDO_GIT_COMMIT", raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.txt").write_text("1")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()

    clean = json.loads(write_manifest(tmp_path / "clean", "run it", repo=repo).read_text())
    assert (clean["git_commit"], clean["git_dirty"]) == (head, False)
    (repo / "a.txt").write_text("2")
    dirty = json.loads(write_manifest(tmp_path / "dirty", ["run it"], repo=repo).read_text())
    assert (dirty["git_commit"], dirty["git_dirty"], dirty["dirty_paths"]) == (head, True, ["a.txt"])
    assert manifest_problems(dirty) == []
    # a commit passed by the caller wins over the checkout's own (a lent machine's copy may carry a stale .git)
    monkeypatch.setenv("PDO_GIT_COMMIT", "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("PDO_GIT_DIRTY", "0")
    passed = json.loads(write_manifest(tmp_path / "passed", "run it", repo=repo).read_text())
    assert (passed["git_commit"], passed["git_dirty"]) == ("0123456789abcdef0123456789abcdef01234567", False)


def test_outside_a_checkout_the_commit_comes_from_the_caller(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PDO_GIT_COMMIT", "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("PDO_GIT_DIRTY", "1")
    document = json.loads(write_manifest(tmp_path / "out", "bash x.sh", repo=tmp_path).read_text())
    assert (document["git_commit"], document["git_dirty"]) == ("0123456789abcdef0123456789abcdef01234567", True)
    monkeypatch.delenv("PDO_GIT_COMMIT")
    document = json.loads(write_manifest(tmp_path / "out2", "bash x.sh", repo=tmp_path).read_text())
    assert document["git_commit"].startswith("unknown (no git checkout")
    assert manifest_problems(document) == []


def test_record_runs_the_command_under_a_manifest_and_check_finds_a_folder_without_one(tmp_path: Path) -> None:
    tool = [sys.executable, str(ROOT / "benchmarks" / "manifest.py")]
    out = tmp_path / "2026-11-26-example"
    done = subprocess.run([*tool, "record", "--out", str(out), "--", sys.executable, "-c", "print('row 1')"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    document = json.loads((out / "manifest.json").read_text())
    assert (document["exit_code"], (out / "output.txt").read_text()) == (0, "row 1\n")
    assert "row 1" in document["command"] and manifest_problems(document) == []

    (tmp_path / "2026-11-26-bare").mkdir()
    check = subprocess.run([*tool, "check", str(out), str(tmp_path / "2026-11-26-bare")],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 1
    assert "2026-11-26-bare: no manifest.json" in check.stdout and "example" not in check.stdout.split("fix:")[0]


def test_a_benchmarks_out_folder_gets_its_manifest_output_and_exit(tmp_path: Path, capsys) -> None:
    from orchestrator.provenance import recorded

    with recorded(tmp_path / "ok"):
        print("| row | 1 |")
    assert capsys.readouterr().out == "| row | 1 |\n"  # still printed
    assert (tmp_path / "ok" / "output.txt").read_text() == "| row | 1 |\n"
    document = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    assert document["exit_code"] == 0 and manifest_problems(document) == []

    with pytest.raises(RuntimeError), recorded(tmp_path / "broke"):
        raise RuntimeError("mid-run")
    assert json.loads((tmp_path / "broke" / "manifest.json").read_text())["exit_code"] == 1
    with recorded(None):  # no --out: nothing written anywhere
        print("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broke", "ok"]


# ---- a results folder holds data, its command and commit: no scripts, no generated report copies

def _committed_results_files() -> list[str]:
    """Paths under benchmarks/results/ that git tracks (the tree's files when this is not a git checkout)."""
    done = subprocess.run(["git", "-C", str(ROOT), "ls-files", "benchmarks/results"], capture_output=True, text=True)
    if done.returncode == 0 and done.stdout:
        return done.stdout.splitlines()
    return [str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks" / "results").rglob("*") if p.is_file()]


def test_no_script_and_no_generated_report_is_committed_inside_a_results_folder() -> None:
    files = _committed_results_files()
    scripts = [f for f in files if f.endswith((".py", ".sh"))]
    assert not scripts, ("scripts inside results folders: move a reusable one to benchmarks/ (covered by "
                         "tests/test_benchmarks_smoke.py) or scripts/device/ (the GPU kit), put a one-off one in "
                         "the folder's scripts.tar.xz, and name the new place in its manifest's `moved`: "
                         + ", ".join(scripts))
    plots = ("/throughput.png", "/latency.png", "/workers.png", "/timeline.png")  # html_report.PLOTS beside a run's result
    reports = [f for f in files if f.endswith("report.html") or ("/runs/" in f and f.endswith(plots))]
    assert not reports, ("generated report copies (`pd-orchestrator report --result runs/<id>/result.json[.xz] --out DIR` "
                         f"rewrites report.html and its plots): {reports}")


def _moved(folder: Path) -> dict:
    path = folder / "manifest.json"
    return json.loads(path.read_text()).get("moved", {}) if path.is_file() else {}


@pytest.mark.parametrize("folder", [f for f in RESULTS if _moved(f)], ids=lambda f: f.name)
def test_a_moved_script_is_where_the_manifest_says(folder: Path) -> None:
    import tarfile

    for old, new in _moved(folder).items():
        assert not (folder / old).exists(), f"{folder.name}: {old} is still there"
        if new.endswith(".tar.xz"):
            with tarfile.open(folder / new) as archive:
                assert old in archive.getnames(), f"{folder.name}/{new} lacks {old}"
        else:
            assert (ROOT / new).is_file() or (folder / new).is_file(), f"{folder.name}: {old} -> {new}: no such file"
