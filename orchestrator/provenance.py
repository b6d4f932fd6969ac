"""Provenance of a results folder: manifest.json with the command, the commit that ran, the machine and its packages.

Stdlib only: the calibration harness and the device scripts write it on bare GPU machines too.
`benchmarks/manifest.py` is the command line (write / record / check); `manifest_problems` is the check.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MANIFEST = "manifest.json"
MANIFEST_KEYS = ("command", "git_commit", "git_dirty", "machine", "gpu", "packages", "started_at")
PACKAGES = ("pd-orchestrator", "ray", "sglang", "sgl-kernel", "torch", "nixl", "nixl-cu12", "pydantic",
            "prometheus-client", "aiohttp", "uvicorn", "sglang-router", "numpy")
REPO = Path(__file__).resolve().parents[1]
# Where the checkout has no .git (a lent GPU machine gets a copy of the working tree), the caller passes these.
COMMIT_ENV, DIRTY_ENV = "PDO_GIT_COMMIT", "PDO_GIT_DIRTY"
_SHA = re.compile(r"\b[0-9a-f]{7,40}\b")


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state(repo: Path = REPO) -> tuple[str, bool | str, list[str]]:
    """(commit, dirty, changed paths). Dirty = tracked files differ from the commit or untracked files exist.
    A commit the caller passes wins: the lent GPU machine's copy of the tree can hold a stale .git (2026-11-26: it
    reported the session's first commit for every call)."""
    passed = os.environ.get(COMMIT_ENV)
    head = None if passed else _git(repo, "rev-parse", "HEAD")
    if head is None:
        commit = passed or f"unknown (no git checkout here; set {COMMIT_ENV})"
        dirty_env = os.environ.get(DIRTY_ENV)
        dirty: bool | str = {"1": True, "0": False}.get(dirty_env or "", "unknown")
        return commit, dirty, []
    status = _git(repo, "status", "--porcelain", "--untracked-files=normal") or ""
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return head.strip(), bool(changed), changed


def gpu_description() -> str:
    """Every GPU nvidia-smi sees (name, memory, driver), or why there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "none (no nvidia-smi)"
    gpus = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not gpus:
        return "none (nvidia-smi found no GPU)"
    return f"{len(gpus)} x " + "; ".join(sorted(set(gpus)))


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return "? GiB"


def cpu_model() -> str:
    """/proc/cpuinfo's model name (platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_description() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (f"{socket.gethostname()}: {platform.platform()}, {os.cpu_count()} cores ({cpu_model()}), "
            f"{_memory_gib()} RAM, load average {load} at the start")


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def build_manifest(command: str | list[str], *, started_at: str | None = None, repo: Path = REPO) -> dict:
    """The manifest of a run that starts now (or at `started_at`), from this machine and checkout."""
    commit, dirty, changed = git_state(repo)
    document = {
        "command": command,
        "git_commit": commit,
        "git_dirty": dirty,
        "machine": machine_description(),
        "gpu": gpu_description(),
        "packages": package_versions(),
        "started_at": started_at or utc_now(),
    }
    if changed:
        document["dirty_paths"] = changed[:200]
    return document


def write_manifest(folder: Path | str, command: str | list[str], *, started_at: str | None = None,
                   repo: Path = REPO, append: bool = False, **extra: object) -> Path:
    """Write `folder`/manifest.json (the folder is created); `extra` keys are added as they are.

    append=True keeps an existing manifest and adds `command` to its list of commands."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MANIFEST
    if append and path.is_file():  # a folder gathering several calls: one manifest, every command
        document = json.loads(path.read_text())
        earlier = document.get("command") or []
        document["command"] = (earlier if isinstance(earlier, list) else [earlier]) + [command]
    else:
        document = build_manifest(command, started_at=started_at, repo=repo) | extra
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    tmp.replace(path)
    return path


def update_manifest(folder: Path | str, **fields: object) -> None:
    """Add fields (finished_at, exit_code, ...) to an existing manifest."""
    path = Path(folder) / MANIFEST
    document = json.loads(path.read_text())
    document.update(fields)
    path.write_text(json.dumps(document, indent=2) + "\n")


def command_line(argv: list[str] | None = None) -> str:
    """This process's command line as typed (the interpreter path made relative to the repo when inside it)."""
    import shlex

    exe = sys.executable
    try:
        exe = str(Path(exe).relative_to(REPO))
    except ValueError:
        pass
    return shlex.join([exe, *(sys.argv if argv is None else argv)])


def _filled(value: object) -> bool:
    if value is None:
        return False
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, (list, dict)):
        return any(_filled(v) for v in (value.values() if isinstance(value, dict) else value))
    return True


def manifest_problems(document: object) -> list[str]:
    """What is missing or malformed in one manifest (empty list = good)."""
    if not isinstance(document, dict):
        return ["manifest is not a JSON object"]
    problems = [f"{key}: missing" for key in MANIFEST_KEYS if key not in document]
    problems += [f"{key}: empty" for key in MANIFEST_KEYS if key in document and not _filled(document[key])]
    if problems:
        return problems
    commit = document["git_commit"]
    if not isinstance(commit, str) or not (commit.startswith("unknown") or _SHA.search(commit)):
        problems.append(f"git_commit: {commit!r} is neither a commit hash nor 'unknown (reason)'")
    if not isinstance(document["git_dirty"], (bool, str)):
        problems.append("git_dirty: must be true, false or a string saying what is known")
    if not isinstance(document["command"], (str, list)):
        problems.append("command: must be a string or a list of strings")
    if not isinstance(document["packages"], (dict, str)):
        problems.append("packages: must be {name: version} or a string saying what is known")
    started = document["started_at"]
    try:
        dt.datetime.fromisoformat(str(started).replace("Z", "+00:00"))
    except ValueError:
        problems.append(f"started_at: {started!r} is not an ISO date/time (e.g. 2026-11-26T04:05:00+00:00)")
    return problems


def folder_problems(folder: Path) -> list[str]:
    path = folder / MANIFEST
    if not path.is_file():
        return [f"{folder.name}: no {MANIFEST}"]
    try:
        document = json.loads(path.read_text())
    except ValueError as exc:
        return [f"{folder.name}/{MANIFEST}: not JSON ({exc})"]
    return [f"{folder.name}/{MANIFEST}: {p}" for p in manifest_problems(document)]


class _Tee:
    """sys.stdout that also writes to a file."""

    def __init__(self, stream, copy) -> None:
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.copy.flush()
        self.stream.flush()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextmanager
def recorded(folder: Path | str | None, output: str = "output.txt") -> Iterator[None]:
    """A benchmark's `--out DIR`: manifest.json before it starts, its stdout copied to DIR/output, and
    finished_at + exit_code (0, or 1 when it raised) added at the end. No folder: nothing is written."""
    if folder is None:
        yield
        return
    folder = Path(folder)
    write_manifest(folder, command_line())
    code = 1
    with open(folder / output, "w") as copy:
        stdout, sys.stdout = sys.stdout, _Tee(sys.stdout, copy)
        try:
            yield
            code = 0
        finally:
            sys.stdout = stdout
            update_manifest(folder, finished_at=utc_now(), exit_code=code)
