"""A disk cache for what `plan` derives from the back-tests on every run (the error band, the closed-loop band),
read back only for the same inputs.

dataset (runs.yaml, closed_loop.yaml) -> inputs: every file under orchestrator/ (code, profiles, presets, rules),
configs/, models/ and benchmarks/backtest/, the dataset itself, each file its rows name (runs.yaml: batch files,
configs, the first evidence file when it is JSON, whose schema `throughput_scope` reads; closed_loop.yaml: configs and
the recorded `plan --json` files), the Python and library versions -> one sha256 key
-> $PD_ORCHESTRATOR_CACHE_DIR/backtest/<name>-<hash of the dataset's path>.json = {key, named, value}.

An entry is used only when the key of today's inputs equals its key; otherwise (or when the file is damaged) the value
is recomputed and the entry overwritten. Nothing depends on the working directory (the back-tests take their configs'
model folders from the repository root), so an entry serves `plan` run from anywhere. The files the rows name are
stored in the entry, so a hit needs no YAML parse: the list is a function of the dataset, and the dataset is part of
the key. tests/plan/test_backtest_cache.py computes the band in a fresh process outside the repository and fails if it
reads a file these inputs do not cover.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from orchestrator.workload.tokenizer import user_cache_dir, write_atomically

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
FORMAT = 1
TREES = ("orchestrator", "configs", "models", "benchmarks/backtest")  # read by the prediction, hashed whole
LIBRARIES = ("pyyaml", "pydantic", "pydantic-core", "numpy")

T = TypeVar("T")


def _load(dataset: Path) -> dict:
    return yaml.load(dataset.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}


def named_files(dataset: Path) -> list[Path]:
    """The files runs.yaml's rows name: batch files (beside the dataset), configs and JSON evidence (repository
    root)."""
    data = _load(dataset)
    names = {dataset.parent / spec["file"] for spec in (data.get("batches") or {}).values() if "file" in spec}
    for row in data.get("runs") or []:
        if row.get("config"):
            names.add(ROOT / row["config"])
        evidence = str(row.get("evidence", "")).split()
        if evidence and evidence[0].endswith((".json", ".json.xz")):  # a raw file committed as is or xz-compressed
            names.add(ROOT / evidence[0])
    return sorted(names)


def closed_loop_named_files(dataset: Path) -> list[Path]:
    """The files closed_loop.yaml's rows name: configs and the recorded predictions' `plan --json` files."""
    names = set()
    for row in _load(dataset).get("rows") or []:
        names.add(ROOT / row["config"])
        recorded = row.get("recorded")
        names.update(ROOT / spec["path"] for spec in ([recorded] if isinstance(recorded, dict) else recorded or []))
    return sorted(names)


def input_files(dataset: Path, named: Iterable[Path], trees: Iterable[Path] | None = None) -> list[Path]:
    """Every file the key covers: the trees' files (no bytecode), the dataset and the files its rows name."""
    files = {dataset, *named}
    for tree in trees if trees is not None else (ROOT / t for t in TREES):
        files.update(p for p in tree.rglob("*") if "__pycache__" not in p.parts and p.is_file())
    return sorted(files)


def fingerprint(files: Iterable[Path]) -> str:
    """sha256 over each file's path and bytes (a missing file counts as missing) and the versions it ran with."""
    digest = hashlib.sha256(f"{FORMAT}\0{sys.version}".encode())
    for library in LIBRARIES:
        try:
            digest.update(f"\0{library}={importlib.metadata.version(library)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"\0{library}=none".encode())
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            data, state = b"", "missing"
        else:
            state = str(len(data))
        digest.update(f"\0{path}\0{state}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def entry_path(name: str, dataset: Path) -> Path:
    where = hashlib.sha256(str(dataset).encode()).hexdigest()[:16]
    return user_cache_dir() / "backtest" / f"{name}-{where}.json"


def cached(name: str, dataset: Path, compute: Callable[[], T], encode: Callable[[T], Any],
           decode: Callable[[Any], T], names: Callable[[Path], list[Path]] = named_files) -> T:
    """`compute()`'s value for this dataset and today's inputs (`names(dataset)`: the files its rows name): the
    stored one when its key matches, else computed (the key taken before computing, so an input edited meanwhile
    makes the entry miss next time) and stored."""
    dataset = dataset.resolve()
    path = entry_path(name, dataset)
    try:
        entry = json.loads(path.read_text())
        named = [Path(p) for p in entry["named"]]
        if entry["key"] == fingerprint(input_files(dataset, named)):
            return decode(entry["value"])
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a damaged entry is recomputed, never trusted
        log.warning("ignoring unreadable back-test cache entry %s (%s)", path, exc)
    named = names(dataset)
    key = fingerprint(input_files(dataset, named))
    value = compute()
    body = {"key": key, "named": [str(p) for p in named], "value": encode(value)}
    try:
        write_atomically(path, json.dumps(body).encode())
    except OSError as exc:  # a read-only home costs the recomputation next time, nothing else
        log.warning("could not cache the back-test's %s in %s (%s)", name, path.parent, exc)
    return value
