"""One supervised child process: start in its own session with a log file, wait ready, stop its whole tree.

ManagedProcess(argv, log_path, env).start() -> wait_ready(check, timeout_s) -> stop(). A process started by
another command (a raylet of `cluster up`, the Prometheus of `monitor up`) is stopped through
`ManagedProcess.attach(pid)`. Engines, raylets and Prometheus all run this way; stdlib only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, Callable


class ProcessError(RuntimeError):
    """The process exited or never became ready; the message names it and ends with its log tail."""


class ProcessTimeout(ProcessError):
    """The process still runs but was not ready within its timeout."""


def pid_alive(pid: int) -> bool:
    """True if `pid` runs; a zombie (exited, not yet reaped by its adopting parent) counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid` (from /proc), so processes that left the group are killed too."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def reap(pid: int) -> bool:
    """Collect `pid`'s exit status if it is our exited child (no zombie lingers); True if it had exited."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False  # not our child (started by another command): pid_alive decides
    return done == pid


def tail(path: str | Path | None, lines: int = 20) -> str:
    """The last `lines` lines of a log file, or '(no log)'."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:]) if path else "(no log)"
    except OSError:
        return "(no log)"


class ManagedProcess:
    """One child process in its own session (process group); stdout and stderr go to `log_path`."""

    def __init__(self, argv: list[str], log_path: str | Path | None, env: dict[str, str] | None = None,
                 what: str = "process"):
        self.argv = argv
        self.log_path = Path(log_path) if log_path else None
        self.env = env  # the whole environment; None inherits ours
        self.what = what  # how messages name it ("engine", "prometheus", ...)
        self.popen: subprocess.Popen | None = None
        self._pid: int | None = None
        self.started_at: float | None = None

    @classmethod
    def attach(cls, pid: int, log_path: str | Path | None = None, what: str = "process") -> "ManagedProcess":
        """A process another command started (its pid recorded in a state file), to watch or stop."""
        proc = cls([], log_path, what=what)
        proc._pid = pid
        return proc

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else self._pid

    def start(self) -> int:
        """Start in a new session (we signal exactly its group, never by name); returns the pid."""
        log: int | IO[bytes] = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "ab")
        self.started_at = time.time()
        try:
            self.popen = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            if not isinstance(log, int):
                log.close()
        return self.popen.pid

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return self._pid is not None and pid_alive(self._pid) and not reap(self._pid)

    @property
    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    def log_tail(self, lines: int = 20) -> str:
        return tail(self.log_path, lines)

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float, poll_s: float = 0.2,
                   where: str = "") -> float:
        """Poll `ready()` until it is true; seconds since start. ProcessError (with the log tail) if the
        process exits first or `timeout_s` passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                log = f"; log {self.log_path}:\n{self.log_tail()}" if self.log_path else ""
                raise ProcessError(f"{self.what} exited with code {self.returncode if self.popen else '?'} "
                                   f"before it was ready{log}")
            if ready():
                return time.time() - (self.started_at or time.time())
            time.sleep(poll_s)  # the poll interval of a readiness check
        log = f"; log {self.log_path}:\n{self.log_tail()}" if self.log_path else ""
        raise ProcessTimeout(f"{self.what}{' at ' + where if where else ''} not ready after {timeout_s:.0f}s{log}")

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, wait up to `grace_s`, then SIGKILL the group and every descendant
        (also those that left the group): no orphans. Safe to call twice."""
        pid = self.pid
        if pid is None:
            return
        tree = [pid, *descendants(pid)]
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(pid_alive(p) for p in tree):
            reap(pid)
            time.sleep(0.05)
        for p in tree:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.popen is not None:
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        else:
            reap(pid)
