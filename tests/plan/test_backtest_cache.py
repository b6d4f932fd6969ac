"""The back-tests' disk cache (plan's error band and closed-loop band) cannot hand back a stale value: its key covers every file the
prediction reads (checked in a fresh process that records every file it opens), a change to any such file changes
the key, and an entry is used only under the key it was written with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from orchestrator.plan.backtest import band as backtest_band
from orchestrator.plan.backtest.dataset import DATASET
from orchestrator.plan.backtest_cache import (
    ROOT,
    closed_loop_named_files,
    entry_path,
    fingerprint,
    input_files,
    named_files,
)
from orchestrator.plan.closedloop import backtest as closed_loop

RUN_ROW, POINT_ROW = "h200x2-v2lite-agg-tp2-product", "h200x2-r1s6-tp2-decode-1x256"  # quick to simulate


def test_a_fresh_process_reads_no_file_outside_the_keyed_inputs(tmp_path):
    """Every file computing the bands and the models opens is part of the key; every folder it lists is hashed
    whole. Run outside the repository: the entry serves `plan` from any working directory, so nothing may be read
    relative to it."""
    # the tree under test's package, found by name as the editable install's finder finds it (in a git worktree that
    # shares another checkout's venv, that finder names the other checkout); its root is off sys.path again before the
    # hook, so nothing else is looked up there
    root = repr(str(ROOT))
    under_test = f"import sys\nsys.path.insert(0, {root})\nimport orchestrator\nsys.path.remove({root})\n"
    script = under_test + textwrap.dedent("""
        import json, os, sys
        opened, listed = set(), set()
        def hook(event, args):
            if event == "open" and isinstance(args[0], str) and not (args[1] or "r").startswith(("w", "a", "x")):
                opened.add(os.path.realpath(args[0]))
            elif event in ("os.listdir", "os.scandir") and isinstance(args[0], str):
                listed.add(os.path.realpath(args[0]))
        sys.addaudithook(hook)
        from orchestrator.plan import backtest_cache
        from orchestrator.plan.backtest import band
        from orchestrator.plan.backtest.dataset import DATASET
        from orchestrator.plan.closedloop import backtest as closed_loop
        assert band.error_band() is not None and band.out_of_sample_models()
        assert closed_loop.closed_loop_backtest()
        dataset, closed = DATASET.resolve(), closed_loop.DATASET.resolve()
        inputs = backtest_cache.input_files(dataset, backtest_cache.named_files(dataset))
        inputs += backtest_cache.input_files(closed, backtest_cache.closed_loop_named_files(closed))
        print(json.dumps({"opened": sorted(opened), "listed": sorted(listed), "inputs": [str(p) for p in inputs]}))
    """)
    cache = tmp_path / "cache"  # empty: the band is computed, not read back
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PD_ORCHESTRATOR_CACHE_DIR": str(cache), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, "-c", script], cwd=elsewhere, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    python = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
    trees = tuple(str(ROOT / t) + os.sep for t in ("orchestrator", "configs", "models", "benchmarks/backtest"))
    # not inputs: bytecode (compiled from the hashed source, which Python checks it against), package metadata,
    # the editable install's import hook (a name, not a file)
    outside = [p for p in seen["opened"] if not p.startswith(python + (str(cache) + os.sep,))
               and p not in set(seen["inputs"]) and "__pycache__" not in p and ".egg-info" + os.sep not in p
               and Path(p).exists()]
    assert not outside, f"the band read files its cache key does not cover (add them to backtest_cache): {outside}"
    # the import system lists the working directory (sys.path's ''); nothing else may be listed outside the trees
    unhashed = [d for d in seen["listed"] if not (d + os.sep).startswith(python + trees)
                and d != os.path.realpath(elsewhere) and Path(d).exists()]
    assert not unhashed, f"the band listed folders its cache key does not hash whole: {unhashed}"
    assert str(ROOT / "benchmarks/backtest/runs.yaml") in seen["inputs"]


def small_dataset(folder: Path) -> Path:
    """runs.yaml with one out-of-sample full run and one calibration point of the real dataset, its batch file beside."""
    data = yaml.safe_load(DATASET.read_text())
    rows = [r for r in data["runs"] if r["id"] in (RUN_ROW, POINT_ROW)]
    batches = {r["batch"]: data["batches"][r["batch"]] for r in rows}
    for spec in batches.values():
        if "file" in spec:
            (folder / spec["file"]).write_bytes((DATASET.parent / spec["file"]).read_bytes())
    path = folder / "runs.yaml"
    path.write_text(yaml.safe_dump({"batches": batches, "runs": rows}))
    return path


def test_an_entry_is_used_only_under_the_key_it_was_written_with(tmp_path, monkeypatch):
    monkeypatch.setenv("PD_ORCHESTRATOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(ROOT)
    dataset = small_dataset(tmp_path)
    predicted = []
    real_predict_row = backtest_band.predict_row
    monkeypatch.setattr(backtest_band, "predict_row", lambda *a: predicted.append(a[0]["id"]) or real_predict_row(*a))

    def band():
        backtest_band._error_band_cached.cache_clear()  # the in-process cache; the disk entry is what is under test
        return backtest_band.error_band(dataset)

    first = band()
    assert first is not None and first.rows == 1 and first.points == 1 and len(predicted) == 2
    assert entry_path("error-band", dataset.resolve()).is_file()
    assert band() == first and len(predicted) == 2  # read back: same inputs, nothing simulated

    data = yaml.safe_load(dataset.read_text())
    data["runs"][[r["id"] for r in data["runs"]].index(RUN_ROW)]["measured"]["total_tok_s"] *= 2
    dataset.write_text(yaml.safe_dump(data))
    edited = band()
    assert len(predicted) == 4 and edited != first
    assert edited == backtest_band._compute_error_band(str(dataset.resolve()))  # simulates both rows again

    batch_file = next(p for p in named_files(dataset) if p.parent == tmp_path)
    batch = json.loads(batch_file.read_text())
    batch["lengths"] = batch["lengths"][: len(batch["lengths"]) // 2]
    batch_file.write_text(json.dumps(batch))
    assert band() != edited and len(predicted) == 8  # a file the rows name is part of the key

    entry_path("error-band", dataset.resolve()).write_text('{"key": ')  # damaged: recomputed, not trusted
    assert band() is not None and len(predicted) == 10
    assert band() is not None and len(predicted) == 10

    # from another working directory the same entry is read back: the rows' configs name their model folders from
    # the repository root, whatever the working directory
    at_root = band()
    monkeypatch.chdir(tmp_path)
    assert band() == at_root and len(predicted) == 10
    entry_path("error-band", dataset.resolve()).unlink()
    assert band() == at_root and len(predicted) == 12  # and computed there, the same band


def test_a_closed_loop_entry_is_used_only_under_the_key_it_was_written_with(tmp_path, monkeypatch):
    monkeypatch.setenv("PD_ORCHESTRATOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(ROOT)
    rows = yaml.safe_load(closed_loop.DATASET.read_text())["rows"]
    row = next(r for r in rows if r.get("recorded") and r.get("measured"))  # names a config and a recorded file
    dataset = tmp_path / "closed_loop.yaml"
    dataset.write_text(yaml.safe_dump({"rows": [row]}))
    computed = []
    real = closed_loop._compute_backtest
    monkeypatch.setattr(closed_loop, "_compute_backtest", lambda path: computed.append(path) or real(path))

    def checks():
        closed_loop._backtest_cached.cache_clear()
        return closed_loop.closed_loop_backtest(dataset)

    first = checks()
    assert len(computed) == 1 and entry_path("closed-loop-checks", dataset.resolve()).is_file()
    again = checks()
    assert len(computed) == 1 and again == first  # read back whole: recorded predictions and bounds included
    assert closed_loop.closed_loop_table(again) == closed_loop.closed_loop_table(first)
    recorded = row["recorded"] if isinstance(row["recorded"], list) else [row["recorded"]]
    assert {ROOT / row["config"], *(ROOT / r["path"] for r in recorded)} <= set(closed_loop_named_files(dataset))

    row["measured"]["output_tok_s"] *= 2
    dataset.write_text(yaml.safe_dump({"rows": [row]}))
    edited = checks()
    assert len(computed) == 2 and edited[0].error("output_tok_s") != first[0].error("output_tok_s")


def test_the_key_changes_with_any_byte_name_or_file_of_the_inputs(tmp_path):
    tree, dataset, named = tmp_path / "tree", tmp_path / "runs.yaml", tmp_path / "batch.json"
    (tree / "sub").mkdir(parents=True)
    (tree / "model.py").write_text("STEP_S = 1.0\n")
    (tree / "sub" / "profile.json").write_text('{"a": 1}')
    dataset.write_text("runs: []\n")

    def key() -> str:
        return fingerprint(input_files(dataset, [named], trees=[tree]))

    base = key()
    assert key() == base
    (tree / "sub" / "profile.json").write_text('{"a": 2}')
    assert key() != base
    (tree / "sub" / "profile.json").write_text('{"a": 1}')
    assert key() == base
    (tree / "sub" / "new.json").write_text("{}")
    assert key() != base
    (tree / "sub" / "new.json").unlink()
    (tree / "model.py").rename(tree / "model2.py")
    assert key() != base
    (tree / "model2.py").rename(tree / "model.py")
    assert key() == base
    named.write_text("[]")  # a named file that did not exist when the entry was written
    assert key() != base
    (tree / "__pycache__").mkdir()
    (tree / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    named.unlink()
    assert key() == base  # bytecode is not an input


@pytest.mark.parametrize("name", ["error-band", "out-of-sample-models"])
def test_entries_of_two_datasets_do_not_share_a_file(tmp_path, name):
    assert entry_path(name, tmp_path / "a" / "runs.yaml") != entry_path(name, tmp_path / "b" / "runs.yaml")
