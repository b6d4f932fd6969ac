"""`serve --detach`: start the service as its own process (its lines go to `<state dir>/<name>.log`), return once
it printed its ready line (or failed), leaving it to `serve status | apply | down`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from orchestrator.run.serving.control import LOG_ENV



def start_detached(argv: list[str], directory: Path, name: str, timeout_s: float,
                   say: Callable[[str], None] = print) -> int:
    """Run `python -m orchestrator serve <argv>` in a new session, echo its lines until `ready:`; 0 once ready."""
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / f"{name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "serve", *argv], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", LOG_ENV: str(log_path)})
    deadline = time.monotonic() + timeout_s
    shown = 0
    while True:
        lines = log_path.read_text(errors="replace").splitlines()
        for line in lines[shown:]:
            say(line)
        shown = len(lines)
        if any(line.startswith("ready: ") for line in lines):
            say(f"detached: pid {proc.pid}, log {log_path}; `pd-orchestrator serve status --name {name}`, "
                f"`serve apply --name {name} --set ...`, `serve down --name {name}`")
            return 0
        if proc.poll() is not None:
            say(f"serve did not come up (exit {proc.returncode}); its log: {log_path}")
            return proc.returncode or 1
        if time.monotonic() > deadline:
            say(f"serve not ready after {timeout_s:g} s; still starting as pid {proc.pid} (log {log_path}); "
                f"`pd-orchestrator serve down --name {name}` stops it")
            return 1
        time.sleep(0.3)
