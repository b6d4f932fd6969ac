"""Lease 7's device scripts, dry (no GPU, no py-spy): the watcher waits for the first eager decode line written after
it began, finds the scheduler by its process name and runs the profiler's commands on it; the call script checks its
phase, stages carried pieces, and builds the flags the pre-registration names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts/device"))

import eager_pyspy  # noqa: E402

GRAPHED = "[2026-11-27 01:00:01] Decode batch, #running-req: 900, #token: 9000, token usage: 0.10, cuda graph: True, gen throughput (token/s): 9000.00, #queue-req: 0,\n"
EAGER_SMALL = "[2026-11-27 01:00:02] Decode batch, #running-req: 200, #token: 9000, token usage: 0.10, cuda graph: False, gen throughput (token/s): 4000.00, #queue-req: 0,\n"
EAGER = "[2026-11-27 01:00:03] Decode batch, #running-req: 640, #token: 99000, token usage: 0.30, cuda graph: False, gen throughput (token/s): 9000.00, #queue-req: 0,\n"


def test_the_trigger_is_the_first_eager_line_with_enough_requests_running() -> None:
    row = eager_pyspy.eager_trigger(GRAPHED + EAGER_SMALL + EAGER, 300)
    assert row is not None and row["running"] == 640 and not row["cuda_graph"]
    assert eager_pyspy.eager_trigger(GRAPHED + EAGER_SMALL, 300) is None


def test_a_watch_ignores_eager_lines_written_before_it_began(tmp_path) -> None:
    log = tmp_path / "lone.log"
    log.write_text(EAGER)   # an earlier round of the same server
    assert eager_pyspy.watch(str(log), 300, timeout_s=0.6, poll_s=0.1) == (None, None)

    watched = threading.Event()

    def server_logging() -> None:   # a server logs on until the watch is over, so one line follows the watch's start
        while not watched.wait(0.1):
            with open(log, "a") as f:
                f.write(EAGER.replace("640", "700"))
    writer = threading.Thread(target=server_logging)
    writer.start()
    try:
        row, path = eager_pyspy.watch(str(log), 300, timeout_s=60, poll_s=0.1)
    finally:
        watched.set()
        writer.join()
    assert path == str(log) and row["running"] == 700


FAKE_PYSPY = """#!/bin/sh
# stands in for py-spy: records its argv, writes a raw profile where `record -o FILE` asks for one
echo "$@" >> "$(dirname "$0")/argv.txt"
case "$1" in
  dump) echo "Thread $4 (active): \\"MainThread\\"" ;;
  record) while [ $# -gt 0 ]; do [ "$1" = -o ] && echo "thread ($2): MainThread;run_batch (scheduler.py:3528) 7" > "$2"; shift; done ;;
esac
"""


STAND_IN_SCHEDULER = """import sys, time
open('/proc/self/comm', 'w').write('sglang::scheduler')
print('named', flush=True)
log, line, t, logged = sys.argv[1], sys.argv[2], time.time(), 0.0
while time.time() - t < 120:   # spins, as a scheduler does, and logs an eager decode line every 0.1 s as SGLang does
    if time.time() - logged > 0.1:
        with open(log, 'a') as f:
            f.write(line)
        logged = time.time()
"""


def test_the_watcher_profiles_the_process_named_as_sglang_s_scheduler(tmp_path) -> None:
    pyspy = tmp_path / "py-spy"
    pyspy.write_text(FAKE_PYSPY)
    pyspy.chmod(0o755)
    log = tmp_path / "engine.log"
    log.write_text(GRAPHED)
    # the stand-in keeps logging until it is killed, so an eager line is written after the watch began however late
    # the watch begins on a loaded machine
    sched = subprocess.Popen([sys.executable, "-c", STAND_IN_SCHEDULER, str(log), EAGER], stdout=subprocess.PIPE,
                             text=True)
    idle = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert sched.stdout.readline() == "named\n", "the stand-in scheduler never took its name"
        assert idle.stdout.readline() == "up\n"   # its start-up is over: from here on it waits, using no CPU
        out = tmp_path / "pyspy"
        rc = eager_pyspy.main(["--log-glob", str(tmp_path / "*.log"), "--out", str(out), "--pyspy", str(pyspy),
                               "--server-pid", str(sched.pid), "--record-s", "1", "--dumps", "2", "--timeout-s", "60"])
    finally:
        for p in (sched, idle):
            p.kill()
            p.wait()
        for stream in (sched.stdout, idle.stdin, idle.stdout):
            stream.close()
    assert rc == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["scheduler_pid"] == sched.pid and meta["trigger"]["running"] == 640
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv[0] == f"dump --native --pid {sched.pid}"
    record = next(a for a in argv if a.startswith("record"))
    assert "--native --threads --idle -r 100 -f raw -d 1 -o" in record and record.endswith(f"--pid {sched.pid}")
    assert "run_batch (scheduler.py:3528) 7" in (out / "record.raw").read_text()
    assert (out / "dump-1.txt").exists() and (out / "dump-2.txt").exists() and not (out / "dump-3.txt").exists()
    # the spinning stand-in is seen busy and the blocked one is not; no share floor above the snapshot's own 2 %,
    # since a spinner's share of a core falls with the machine's load, but one thread never uses more than a core
    seen = {t["pid"]: t["core_share"] for t in json.loads((out / "threads-1.json").read_text())["threads"]}
    assert sched.pid in seen and 0.02 < seen[sched.pid] <= 1.1, seen.get(sched.pid)
    assert idle.pid not in seen


def test_the_watcher_refuses_a_missing_profiler_and_a_zero_record(tmp_path) -> None:
    for args in (["--pyspy", str(tmp_path / "absent")], ["--pyspy", sys.executable, "--record-s", "0"],
                 ["--pyspy", sys.executable, "--record-s", "2.5"]):   # py-spy's -d takes whole seconds only
        with pytest.raises(SystemExit) as err:
            eager_pyspy.main(["--log-glob", "x", "--out", str(tmp_path / "o"), *args])
        assert err.value.code == 2


def script(*args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts/device/eager_profile.sh"), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=60)


def test_the_call_script_refuses_an_unknown_phase_and_prints_the_pre_registered_flags() -> None:
    bad = script("ab")
    assert bad.returncode == 2 and "unknown phase 'ab'" in bad.stderr
    dry = script("agg", env={"DRY_RUN": "1"})
    assert dry.returncode == 0
    assert "layout.aggregated.0.tp=1 --set layout.aggregated.0.mem_fraction_static=0.65" in dry.stdout
    assert '--decode-log-interval,"10"' in dry.stdout and "--concurrency 1000" in dry.stdout
    assert "--min-running 540" in dry.stdout and "--new-tokens 256" in dry.stdout and "--gpu 1" in dry.stdout


def test_stage_copies_the_carried_pieces_and_fails_when_none_came(tmp_path) -> None:
    (tmp_path / ".device/lease7").mkdir(parents=True)
    stage = tmp_path / "stage7"
    none = script("stage", env={"STAGE7": str(stage)}, cwd=tmp_path)
    assert none.returncode == 1
    (tmp_path / ".device/lease7/blob.part01").write_bytes(b"x" * 10)
    ok = script("stage", env={"STAGE7": str(stage)}, cwd=tmp_path)
    assert ok.returncode == 0 and (stage / "blob.part01").read_bytes() == b"x" * 10
