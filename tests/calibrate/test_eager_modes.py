"""Lease 10's call script and its probes, without a GPU: the phases and rounds it accepts, the step probe patched
into SGLang 0.5.17's scheduler and the records it writes per step, the fixed-work vCPU probe."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from orchestrator.calibrate.nixl_patch import PatchError
from tests.support import HAVE_SGLANG_SOURCE, NO_SGLANG_SOURCE, copy_sglang_source

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/device/eager_modes.sh"
sys.path.insert(0, str(ROOT / "scripts/device"))
import step_probe_patch  # noqa: E402


def _run(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_an_unknown_phase_or_round_is_refused_with_the_choices_named() -> None:
    r = _run("agg")
    assert r.returncode == 2 and "stage|lone|product" in r.stderr
    r = _run("lone", ROUNDS="base,spin", DRY_RUN="1")
    assert r.returncode == 2 and "'spin'" in r.stderr and "base, pin, unpin, freeze" in r.stderr


def test_the_dry_run_names_the_lone_server_the_rounds_and_the_burst() -> None:
    r = _run("lone", DRY_RUN="1", PIN_CPU="3")
    assert r.returncode == 0, r.stderr
    assert "layout.aggregated.0.tp=1" in r.stdout and "mem_fraction_static=0.65" in r.stdout
    assert "base,pin,unpin,freeze" in r.stdout and "CPU 3" in r.stdout and "--new-tokens 1024" in r.stdout
    assert "replay.py run --stream --concurrency 1000" in r.stdout
    assert "burst" not in _run("lone", DRY_RUN="1", BURST="0").stdout


def test_stage_without_a_carried_piece_fails(tmp_path) -> None:
    r = _run("stage", cwd=tmp_path, STAGE7=str(tmp_path / "stage"))
    assert r.returncode == 1 and "staged 0 piece(s)" in r.stdout


@pytest.mark.skipif(not HAVE_SGLANG_SOURCE, reason=NO_SGLANG_SOURCE)
def test_the_step_probe_patches_sglang_s_scheduler_once(tmp_path) -> None:
    copy_sglang_source([step_probe_patch.TARGET], tmp_path)
    step_probe_patch.patch(tmp_path)
    text = (tmp_path / step_probe_patch.TARGET).read_text()
    step_probe_patch.patch(tmp_path)
    assert (tmp_path / step_probe_patch.TARGET).read_text() == text
    assert text.count(step_probe_patch.MARK) == 1 and text.endswith("Scheduler.run_batch = _pdo_probed_run_batch\n")
    compile(text, "scheduler.py", "exec")


def test_a_scheduler_without_run_batch_is_refused(tmp_path) -> None:
    target = tmp_path / step_probe_patch.TARGET
    target.parent.mkdir(parents=True)
    target.write_text("import time\nimport torch\n\nclass Scheduler:\n    def step(self):\n        pass\n")
    with pytest.raises(PatchError, match="run_batch"):
        step_probe_patch.patch(tmp_path)


class _HostEvent:
    """CUDA events on the host clock: this machine has no GPU; the probe only records, queries and subtracts."""

    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: "_HostEvent") -> float:
        return (other.t - self.t) * 1e3


def test_the_probe_writes_a_line_per_step_with_its_gc_and_allocator_counts(tmp_path, monkeypatch) -> None:
    out = tmp_path / "steps.jsonl"
    monkeypatch.setenv("PDO_STEP_PROBE", str(out))
    device_allocs = iter(range(0, 100, 2))   # the allocator's cumulative count: two cudaMallocs a step
    mode = types.SimpleNamespace(is_decode=lambda: True, is_extend=lambda: False)
    batch = types.SimpleNamespace(forward_mode=mode, batch_size=lambda: 600)

    class Scheduler:
        forward_ct = 0

        def run_batch(self, batch):
            self.forward_ct += 1
            gc.collect()   # one generation-2 collection inside each step
            time.sleep(0.005)
            return self.forward_ct

    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Event=_HostEvent, synchronize=lambda: None, current_stream=lambda: None,
        memory_stats=lambda: {"num_alloc_retries": 0, "num_device_alloc": next(device_allocs)}))
    ns = {"Scheduler": Scheduler, "torch": torch, "time": time}
    exec(step_probe_patch.TAIL, ns)
    sched = Scheduler()
    try:
        for k in range(4):
            assert sched.run_batch(batch) == k + 1
        ns["_pdo_probe"].out.flush()
        lines = [json.loads(x) for x in out.read_text().splitlines()]
    finally:
        gc.callbacks.remove(ns["_pdo_probe"].on_gc)
    steps = lines
    assert [x["i"] for x in steps] == [1, 2, 3]   # the last step's line waits for its events, read at the next step
    assert steps[0]["anc"] == 1 and steps[0]["m"] == "d" and steps[0]["bs"] == 600
    assert all(x["wall"] >= 5 and x["gpu"] >= 5 and abs(x["g1"]) < 1 for x in steps)
    # a line's per / gc / mem cover the iteration before it: the previous step's run_batch and what followed it
    assert all(x["per"] >= prev["wall"] and x["gc"][2] == 1 and x["rq"] >= 0 and x["mem"] == [0, 2, 0]
               for prev, x in zip(steps, steps[1:]))


def test_the_vcpu_probe_times_its_fixed_loop_and_refuses_a_cpu_it_cannot_use(tmp_path) -> None:
    probe = ROOT / "scripts/device/vcpu_probe.py"
    out = tmp_path / "v.jsonl"
    cpu = min(os.sched_getaffinity(0))
    r = subprocess.run([sys.executable, str(probe), "--cpu", str(cpu), "--out", str(out), "--duration-s", "0.3",
                        "--loops", "1000"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    head, *rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert head["cpu"] == cpu and rows and all(x["wall_ms"] > 0 and x["cpu_ms"] >= 0 for x in rows)
    r = subprocess.run([sys.executable, str(probe), "--cpu", "100000", "--out", str(out)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "--cpu 100000" in r.stderr


def test_the_product_phase_benches_the_row_as_shipped_then_at_100_in_flight() -> None:
    r = _run("product", DRY_RUN="1")
    assert r.returncode == 0, r.stderr
    assert "burst-shipped" in r.stdout and "benchmark.max_in_flight=100" in r.stdout
    assert "layout.aggregated.0.tp=1" in r.stdout


def test_product_legs_picks_the_legs_and_refuses_an_unknown_one() -> None:
    r = _run("product", DRY_RUN="1", PRODUCT_LEGS="shipped")
    assert r.returncode == 0, r.stderr
    assert "burst-shipped" in r.stdout and "max_in_flight=100" not in r.stdout
    bad = _run("product", DRY_RUN="1", PRODUCT_LEGS="shipped,fast")
    assert bad.returncode == 2 and "PRODUCT_LEGS: unknown leg 'fast'" in bad.stderr
