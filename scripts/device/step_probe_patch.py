"""Per-step timestamps for SGLang 0.5.17's scheduler (issue 25, lease 10): what a slow eager decode step is made of.

Appends to `sglang/srt/managers/scheduler.py` a wrapper around `Scheduler.run_batch` that, only when the server's
environment names a file in PDO_STEP_PROBE, writes one JSON line per batch the scheduler launches:
  i, m, bs    forward count, mode (d decode, e extend, o other), requests in the batch
  t0          wall time (epoch s) when run_batch began
  per         ms since the previous run_batch began: the previous iteration's length (the step as the loop lives
              it); it_cpu, rq, run, sl, gc and mem cover the same previous iteration
  wall, cpu   run_batch's wall ms and the scheduler thread's CPU ms inside it (time.thread_time)
  it_cpu      the thread's CPU ms over that iteration (run_batch + result processing + scheduling)
  c0, c1      the CPU the thread ran on at run_batch's start and end (/proc/thread-self/stat field 39)
  rq, run, sl the thread's run-queue wait ms, on-CPU ms and timeslices (/proc/thread-self/schedstat)
  gc          collections of generations 0, 1, 2 and their ms (gc.callbacks, any thread)
  mem         the caching allocator's retries (a cudaFree of every cached block, then cudaMalloc again), device
              allocations and device frees (torch.cuda.memory_stats; ~0.1 ms a call)
  gpu         CUDA-event ms from the forward stream reaching run_batch's start to its end (GPU side of the step)
  g0, g1      ms by which the GPU reached run_batch's start / end after the CPU recorded them (GPU clock mapped to
              the host's through an anchor event recorded on an idle GPU): g1 near 0 = the GPU waited for the
              launches (launch-bound), g1 large = the GPU ran behind the CPU (GPU-bound)
  anc         1 on the step whose start re-anchored the clocks (one device sync, every 1,000 steps)
No timing changes what SGLang does: no sync but the anchor's, no extra kernel; events are read with query() (never
waited on) when a later step begins.

  python3 scripts/device/step_probe_patch.py SITE_DIR      (idempotent; refuses a changed scheduler.py)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from orchestrator.calibrate.nixl_patch import PatchError, apply

TARGET = "sglang/srt/managers/scheduler.py"
MARK = "# pd-orchestrator step probe v1"
ANCHOR = "    def run_batch(\n        self,\n        batch: ScheduleBatch,\n"   # the method the tail wraps must be there

TAIL = '''

''' + MARK + '''
import gc as _pdo_gc
import json as _pdo_json
import os as _pdo_os


class _PdoStepProbe:
    """One JSON line per run_batch (see scripts/device/step_probe_patch.py in pd-orchestrator)."""

    REANCHOR_STEPS = 1000

    def __init__(self, path, stream):
        self.out = open(path, "a", buffering=1 << 16)
        self.stream = stream
        self.stat_fd = _pdo_os.open("/proc/thread-self/stat", _pdo_os.O_RDONLY)
        self.sched_fd = _pdo_os.open("/proc/thread-self/schedstat", _pdo_os.O_RDONLY)
        self.gc = [0, 0, 0, 0.0, 0.0, 0.0]
        self.gc_t0 = None
        _pdo_gc.callbacks.append(self.on_gc)
        self.pending = []
        self.anchor = None
        self.since_anchor = 0
        self.prev = None
        self.flushed = time.monotonic()

    def on_gc(self, phase, info):
        if phase == "start":
            self.gc_t0 = time.perf_counter()
        elif self.gc_t0 is not None:
            g = min(int(info.get("generation", 0)), 2)
            self.gc[g] += 1
            self.gc[3 + g] += time.perf_counter() - self.gc_t0
            self.gc_t0 = None

    def cpu_now(self):
        s = _pdo_os.pread(self.stat_fd, 4096, 0).decode()
        return int(s[s.rfind(")") + 2:].split()[36])

    def schedstat(self):
        return [int(x) for x in _pdo_os.pread(self.sched_fd, 256, 0).split()[:3]]

    def mem(self):
        m = torch.cuda.memory_stats()
        return [m.get("num_alloc_retries", 0), m.get("num_device_alloc", 0), m.get("num_device_free", 0)]

    def reanchor(self):
        torch.cuda.synchronize()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(self.stream)
        ev.synchronize()
        self.anchor = (ev, time.perf_counter())
        self.since_anchor = 0

    def flush_done(self):
        while self.pending and self.pending[0][2].query():
            rec, ev0, ev1, c_start, c_end, anchor = self.pending.pop(0)
            a_ev, a_t = anchor
            g_start = a_t + a_ev.elapsed_time(ev0) / 1e3
            g_end = a_t + a_ev.elapsed_time(ev1) / 1e3
            rec["gpu"] = round(ev0.elapsed_time(ev1), 3)
            rec["g0"] = round((g_start - c_start) * 1e3, 3)
            rec["g1"] = round((g_end - c_end) * 1e3, 3)
            self.out.write(_pdo_json.dumps(rec) + "\\n")
        if time.monotonic() - self.flushed > 1.0:   # a server stopped by a signal keeps all but its last second
            self.out.flush()
            self.flushed = time.monotonic()

    def begin(self, scheduler, batch):
        self.flush_done()
        anchored = 0
        if self.anchor is None or self.since_anchor >= self.REANCHOR_STEPS:
            self.reanchor()
            anchored = 1
        self.since_anchor += 1
        mode = batch.forward_mode
        rec = {"i": scheduler.forward_ct + 1, "m": "d" if mode.is_decode() else ("e" if mode.is_extend() else "o"),
               "bs": batch.batch_size(), "t0": round(time.time(), 4), "c0": self.cpu_now(), "anc": anchored}
        t, cpu, sched, mem = time.perf_counter(), time.thread_time(), self.schedstat(), self.mem()
        if self.prev is not None:
            pt, pcpu, psched, pgc, pmem = self.prev
            rec["per"] = round((t - pt) * 1e3, 3)
            rec["it_cpu"] = round((cpu - pcpu) * 1e3, 3)
            rec["run"] = round((sched[0] - psched[0]) / 1e6, 3)
            rec["rq"] = round((sched[1] - psched[1]) / 1e6, 3)
            rec["sl"] = sched[2] - psched[2]
            rec["gc"] = [self.gc[k] - pgc[k] for k in range(3)] + [round((self.gc[k] - pgc[k]) * 1e3, 3)
                                                                   for k in range(3, 6)]
            rec["mem"] = [mem[k] - pmem[k] for k in range(3)]
        self.prev = (t, cpu, sched, list(self.gc), mem)
        ev0 = torch.cuda.Event(enable_timing=True)
        ev0.record(self.stream)
        return rec, ev0, t, cpu

    def end(self, started):
        rec, ev0, t, cpu = started
        ev1 = torch.cuda.Event(enable_timing=True)
        ev1.record(self.stream)
        t_end = time.perf_counter()
        rec["wall"] = round((t_end - t) * 1e3, 3)
        rec["cpu"] = round((time.thread_time() - cpu) * 1e3, 3)
        rec["c1"] = self.cpu_now()
        self.pending.append((rec, ev0, ev1, t, t_end, self.anchor))


_pdo_probe = None
_pdo_run_batch = Scheduler.run_batch


def _pdo_probed_run_batch(self, batch, *args, **kwargs):
    global _pdo_probe
    path = _pdo_os.environ.get("PDO_STEP_PROBE")
    if not path or getattr(getattr(self, "ps", None), "tp_rank", 0) != 0:
        return _pdo_run_batch(self, batch, *args, **kwargs)
    if _pdo_probe is None:
        stream = getattr(self, "forward_stream", None) or torch.cuda.current_stream()
        _pdo_probe = _PdoStepProbe(path, stream)
    started = _pdo_probe.begin(self, batch)
    try:
        return _pdo_run_batch(self, batch, *args, **kwargs)
    finally:
        _pdo_probe.end(started)


Scheduler.run_batch = _pdo_probed_run_batch
'''


def patch(site_dir: str | Path) -> list[Path]:
    """Patch scheduler.py under `site_dir` (the folder holding the sglang package); idempotent."""
    path = Path(site_dir) / TARGET
    if path.is_file() and MARK not in (text := path.read_text()):
        if text.count(ANCHOR) != 1 or "\nimport torch\n" not in text or "\nimport time\n" not in text:
            raise PatchError(f"{path}: run_batch, `import torch` or `import time` not found as in SGLang 0.5.17; "
                             "re-check the step probe against this scheduler.py")
    return apply(site_dir, [(TARGET, [], TAIL, MARK)])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: step_probe_patch.py SITE_DIR (the folder holding the installed sglang package)", file=sys.stderr)
        return 2
    try:
        for p in patch(argv[0]):
            print(f"step probe: {p}")
    except PatchError as exc:
        print(f"step probe: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
