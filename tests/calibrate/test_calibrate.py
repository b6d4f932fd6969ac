"""The calibration harness's pure parts, on real SGLang logs recorded on the GPU machines (no GPU needed)."""

from __future__ import annotations

import logging
import tarfile
import threading
import time
from pathlib import Path

import pytest

from orchestrator.calibrate import kvtimeline, logparse, nixl_patch
from orchestrator.calibrate.pd import FLAGS, MODES, _flag_path, _set_mode
from orchestrator.calibrate.pd_readout import (by_mode, chunk_stats, compare_logprobs, cross_prompt_control, kv_delta,
                                               prom_sums)
from tests.support import HAVE_SGLANG_SOURCE, NO_SGLANG_SOURCE, copy_sglang_source

RAW = Path(__file__).resolve().parents[2] / "benchmarks/results/device-h200x2-2026-11-21/raw.tar.xz"


def _member(name: str) -> str:
    with tarfile.open(RAW) as tf:
        return tf.extractfile(name).read().decode()


def test_startup_phases_from_a_real_decode_server_log():
    st = logparse.startup(_member("c3/b/decode.log"))
    # numbers as SGLang printed them on 2xH200 (see startup-times.json of that run)
    assert st["engine_timings_s"]["cuda_graph"]["decode"] == 20.12
    assert st["engine_timings_s"]["scheduler_e2e"] == 28.36
    assert st["weights_gb"] == 29.47 and st["kv_cache_tokens"] == 3064755
    assert st["cuda_graphs"][0]["bs"][0] == 1 and st["cuda_graphs"][0]["bs"][-1] == 256
    assert len(st["cuda_graphs"][0]["bs"]) == 36 and st["cuda_graphs"][0]["capture_s"] == 20.12
    assert st["limits"]["max_running_requests"] == 4096 and st["limits"]["chunked_prefill_size"] == 8192
    marks = st["marks_s"]
    assert marks["load_weight_begin"] <= marks["cuda_graph_begin"] < marks["cuda_graph_end"] <= marks["ready"]
    # capture took 20 s by SGLang's clock; the 1 s log stamps must agree within their resolution
    assert abs((marks["cuda_graph_end"] - marks["cuda_graph_begin"]) - 20.12) <= 1.0


def test_startup_relative_to_launch_time():
    text = _member("c3/b/decode.log")
    first = next(logparse.timestamped(text))[0]
    st = logparse.startup(text, launched_at=first - 7.0)
    assert st["launch_to_first_log_s"] == 7.0
    assert st["phases_s"]["launch->server_args"] >= 7.0


def test_decode_step_time_from_decode_batch_lines():
    rows = logparse.decode_lines(_member("c3/b/decode.log"))
    assert rows and all(r["cuda_graph"] for r in rows[:5])
    one = logparse.decode_step_ms(rows, 1)
    # ~250 token/s at one running request: 4 ms a step
    assert 3.5 < one["step_ms_median"] < 4.5 and one["samples"] >= 5
    missing = logparse.decode_step_ms(rows, 99999)
    assert missing["step_ms_median"] is None and missing["samples"] == 0


def test_a_pd_decode_servers_queues_and_a_prefill_lines_rate_are_read_where_the_line_has_them():
    # lines as SGLang 0.5.17 wrote them (lease 3's PD decode, an aggregated TP 2 server, the PD prefill)
    pd = ("[2026-11-26 16:01:41] Decode batch, #running-req: 2, #token: 333134, token usage: 0.45, pre-allocated usage: "
          "0.43, #prealloc-req: 201, #transfer-req: 799, #retracted-req: 3, cuda graph: True, gen throughput (token/s): "
          "13.29, #queue-req: 5\n")
    agg = ("[2026-11-26 16:05:45 TP0] Decode batch, #running-req: 858, #token: 267701, token usage: 0.16, cuda graph: "
           "False, gen throughput (token/s): 733.84, #queue-req: 0\n")
    prefill = ("[2026-11-26 06:55:16] Prefill batch, #new-seq: 3, #new-token: 8192, #cached-token: 0, token usage: 0.01, "
               "#running-req: 0, #queue-req: 947, #pending-token: 0, #bootstrap-req: 0, #inflight-req: 4, "
               "#optimistic-req: 0, cuda graph: False, input throughput (token/s): 22162.14\n")
    first, second = logparse.decode_lines(pd + agg)
    assert (first["prealloc"], first["transfer"], first["retracted"], first["queue"]) == (201, 799, 3, 5)
    assert first["running"] == 2 and first["cuda_graph"] and first["gen_tok_s"] == 13.29
    assert "prealloc" not in second and second["queue"] == 0 and second["ranks"] == "TP0" and not second["cuda_graph"]
    (row,) = logparse.prefill_lines(prefill)
    assert (row["new_seq"], row["new_tokens"], row["input_tok_s"]) == (3, 8192, 22162.14)
    assert (row["queue"], row["bootstrap"]) == (947, 0)
    (agg_prefill,) = logparse.prefill_lines(prefill.replace("#bootstrap-req: 0, ", ""))
    assert "bootstrap" not in agg_prefill and agg_prefill["queue"] == 947


def test_each_pdo_iter_line_is_read_with_its_stamp_in_log_order():
    # lease 3's prefill: the run's first batch (a cold full chunk) and the next
    text = ("[2026-11-26 16:01:40] PDO_ITER sched_ms=2.59 run_ms=1996.48 gap_ms=-1.00 result_ms=-1.00 poll_ms=0.22 "
            "tail_ms=0.00 running_done_at_top=-1 wait_ms=0.00 polls=0 inflight=0\n"
            "[2026-11-26 16:01:40] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 1\n"
            "[2026-11-26 16:01:41] PDO_ITER sched_ms=93.93 run_ms=332.19 gap_ms=0.06 result_ms=3.14 poll_ms=0.00 "
            "tail_ms=0.00 running_done_at_top=0 wait_ms=0.00 polls=0 inflight=2\n")
    first, second = kvtimeline.iteration_lines(text)
    assert (first["run_ms"], first["sched_ms"], first["inflight"]) == (1996.48, 2.59, 0)
    assert (second["run_ms"], second["result_ms"], second["inflight"]) == (332.19, 3.14, 2)
    assert second["t"] - first["t"] == 1.0


def _anchored_source() -> str:
    # every anchor once, in a module shaped like the real one (imports + logger the tail relies on)
    body = "".join(old for old, _ in nixl_patch.EDITS)
    return "import threading\nimport time\nimport logging\nlogger = logging.getLogger('x')\n" + body


def test_nixl_patch_applies_once_and_is_idempotent():
    src = _anchored_source()
    out = nixl_patch.patch_text(src)
    assert nixl_patch.MARK in out and "and not _pdo_flag('COALESCE')" in out
    assert "shard_idx = bootstrap_room % len(self.transfer_queues)" in out
    assert out.count("_pdo_log_event('") == 2
    assert out.count("_pdo_log_chunk(self, room, kv_chunk") == 1
    assert nixl_patch.patch_text(out) == out


def test_nixl_patch_refuses_a_changed_source():
    src = _anchored_source().replace("            not bypass_prepped\n", "            not skip_prepped\n")
    with pytest.raises(nixl_patch.PatchError, match="edit 1: anchor found 0 times"):
        nixl_patch.patch_text(src)
    doubled = _anchored_source() + nixl_patch.EDITS[0][0]
    with pytest.raises(nixl_patch.PatchError, match="edit 0: anchor found 2 times"):
        nixl_patch.patch_text(doubled)


def _tail_namespace(clock=time):
    ns = {"time": clock, "threading": threading, "logger": logging.getLogger("pdo-test")}
    exec(nixl_patch.TAIL, ns)
    return ns


class StepClock:
    """`time` for the patch's code: wall (`time()`) and `perf_counter()` move together, only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def time(self) -> float:
        return 1_800_000_000.0 + self.now

    def perf_counter(self) -> float:
        return self.now


def test_nixl_patch_flags_follow_env_and_flag_files(tmp_path, monkeypatch):
    ns = _tail_namespace()
    for flag in FLAGS:
        monkeypatch.delenv(f"PDO_NIXL_{flag}", raising=False)
        monkeypatch.setenv(f"PDO_NIXL_{flag}_FILE", str(_flag_path(tmp_path, flag)))
    for mode, flags in MODES.items():
        _set_mode(tmp_path, mode)
        assert {f for f in FLAGS if ns["_pdo_flag"](f)} == set(flags), mode
    _set_mode(tmp_path, "base")
    monkeypatch.setenv("PDO_NIXL_SHARD_BY_ROOM", "1")
    assert ns["_pdo_flag"]("SHARD_BY_ROOM") and not ns["_pdo_flag"]("COALESCE")
    with pytest.raises(KeyError):
        _set_mode(tmp_path, "coalesced")


def test_nixl_patch_log_lines_make_a_request_timeline(monkeypatch, caplog):
    clock = StepClock()
    ns = _tail_namespace(clock)
    monkeypatch.setenv("PDO_NIXL_COALESCE", "1")
    monkeypatch.delenv("PDO_NIXL_SHARD_BY_ROOM", raising=False)
    monkeypatch.delenv("PDO_NIXL_SHARD_BY_ROOM_FILE", raising=False)

    class Args:
        kv_item_lens = [1152] * 27

    class Mgr:
        kv_args = Args()

    class Chunk:
        prefill_kv_indices = list(range(100))
        chunk_id, is_last_chunk = 0, True

    class Queue:
        _buf = [1, 2, 3]

    with caplog.at_level(logging.INFO, logger="pdo-test"):
        ns["_pdo_note_enqueue"](42, 0, 2, Queue())
        clock.advance(0.02)       # the chunk waits in its queue ...
        t_pop = clock.perf_counter()
        clock.advance(0.01)       # ... is posted ...
        t_wait = clock.perf_counter()
        clock.advance(0.01)       # ... and NIXL finishes it
        ns["_PDO_TLS"].descs = 27
        ns["_pdo_log_chunk"](Mgr(), 42, Chunk(), t_pop, t_wait)
        ns["_pdo_log_event"]("prefill_polled", 42)
        clock.advance(0.005)      # the decode's poll sees it 5 ms later
        decode_line = logging.LogRecord("d", logging.INFO, "", 0, "PDO_KV event=decode_seen room=42 t=%.6f",
                                        (clock.time(),), None).getMessage()
    prefill_text = caplog.text
    st = chunk_stats(prefill_text)
    assert st["chunks"] == 1 and st["modes"] == ["coalesced"] and st["descs_mean"] == 27
    assert st["bytes_mean"] == 100 * 27 * 1152 and st["transfer_ms_per_request_median"] == pytest.approx(20.0, abs=1e-3)
    [row] = kvtimeline.requests(prefill_text, decode_line)
    assert (row["queue_index"], row["depth"], row["mode"], row["shard"]) == (2, 3, "coalesced", "dst")
    # 20 ms queued, 10 + 10 ms posting and transfer, polled at once, seen by the decode 5 ms later (1 us: %.6f)
    assert row["queue"] == pytest.approx(20.0, abs=1e-3) and row["worker"] == pytest.approx(20.0, abs=1e-3)
    assert row["prefill_notice"] == pytest.approx(0.0, abs=1e-3)
    assert row["decode_notice"] == pytest.approx(5.0, abs=1e-3)
    assert row["ready_to_seen"] == pytest.approx(45.0, abs=1e-3) and row["sglang_like"] == pytest.approx(40.0, abs=1e-3)
    # a request whose decode line is missing keeps its prefill-side parts
    [alone] = kvtimeline.requests(prefill_text, "")
    assert alone["ready_to_seen"] is None and alone["decode_notice"] is None and alone["queue"] == row["queue"]


def test_kv_computed_time_is_the_batch_that_held_the_last_chunk():
    # request 7 is chunked: its first chunk ran with request 5, its last chunk with request 9
    text = ("PDO_READY t=10.000000 rooms=5,7\n"
            "PDO_READY t=10.300000 rooms=7,9\n"      # seen done at the top of the next overlap iteration
            "PDO_READY t=10.750000 rooms=7,9\n")     # and again when its result was processed
    seen = kvtimeline.ready_times(text)
    assert kvtimeline.computed_at(seen["7"], 10.8) == 10.3          # the last batch, first time seen done
    assert kvtimeline.computed_at(seen["7"], 10.1) == 10.0          # a chunk enqueued before it: the first batch
    assert kvtimeline.computed_at(seen["9"], 10.2) is None
    chunk = ("PDO_NIXL room=7 chunk=1 last=1 slots=10 item_bytes=1152 descs=270 bytes=311040 mode=prepped "
             "post_ms=1.000 wait_ms=2.000 queue=1 depth=0 shard=dst t_enq=10.800000 t_pop=10.810000 t_done=10.813000\n")
    [row] = kvtimeline.requests(text + chunk, "PDO_KV event=decode_seen room=7 t=10.820000\n")
    assert round(row["send_delay"]) == 500 and round(row["computed_to_seen"]) == 520 and round(row["ready_to_seen"]) == 20


def test_timeline_summary_and_per_mode_table():
    rows = [{"room": str(i), "queue_index": i % 2, "mode": "prepped", "shard": "dst", "descs": 100, "bytes": 10,
             **{p: float(i) for p in kvtimeline.PARTS}} for i in range(1, 11)]
    s = kvtimeline.summary(rows)
    assert s["requests"] == 10 and s["queues_used"] == [0, 1]
    assert s["ready_to_seen"]["p50"] == 6.0 and s["ready_to_seen"]["p90"] == 9.0 and s["ready_to_seen"]["max"] == 10.0
    assert kvtimeline.pct([None, 3.0, 1.0, 2.0], 0.5) == 2.0 and kvtimeline.pct([], 0.5) is None
    load = {"wall_s": 8.0, "output_tok_s": 400.0, "sglang_kv": {"kv_transfer_latency_ms_mean": 550.0}, "timeline": s}
    table = by_mode([{**load, "mode": "base"}, {**load, "mode": "base", "wall_s": 6.0},
                     {"mode": "shard", "skipped": "time budget"}])
    assert list(table) == ["base"] and table["base"]["wall_s_mean"] == 7.0
    assert table["base"]["ready_to_seen_p50_median"] == 6.0


@pytest.mark.skipif(not HAVE_SGLANG_SOURCE, reason=NO_SGLANG_SOURCE)
def test_nixl_patch_applies_to_the_installed_sglang_0_5_17_source(tmp_path):
    copy_sglang_source((nixl_patch.TARGET, nixl_patch.PREFILL_TARGET), tmp_path)
    srcs = {t: (tmp_path / t).read_text() for t in (nixl_patch.TARGET, nixl_patch.PREFILL_TARGET)}
    assert nixl_patch.apply(tmp_path) == [tmp_path / nixl_patch.TARGET, tmp_path / nixl_patch.PREFILL_TARGET]
    for target, edits, tail in ((nixl_patch.TARGET, nixl_patch.EDITS, nixl_patch.TAIL),
                                (nixl_patch.PREFILL_TARGET, nixl_patch.PREFILL_EDITS, nixl_patch.PREFILL_TAIL)):
        src, out = srcs[target], (tmp_path / target).read_text()
        added = sum(new.count("\n") - old.count("\n") for old, new in edits)
        assert len(out.splitlines()) == len(src.splitlines()) + added + len(tail.splitlines())
        # only added lines, except the batch wait it wraps in prefill.py: SGLang's other lines stay, in order
        it = iter(out.splitlines())
        kept = [line for line in src.splitlines() if line != "            copy_done.synchronize()"]
        assert all(any(line == o for o in it) for line in kept)
    assert nixl_patch.apply(tmp_path)    # idempotent
    assert (tmp_path / nixl_patch.PREFILL_TARGET).read_text().count("_pdo_wait_polling_transfers(self)") == 1


def test_prefill_poll_patch_refuses_a_changed_loop():
    src = "x = 1\n    def event_loop_overlap_disagg_prefill(self: Scheduler) -> None:\n        while True:\n"
    with pytest.raises(nixl_patch.PatchError, match="edit 0: anchor found 0 times"):
        nixl_patch.patch_text(src, nixl_patch.PREFILL_EDITS, nixl_patch.PREFILL_TAIL, nixl_patch.PREFILL_MARK)


def test_prefill_poll_waits_polling_only_when_on_single_rank_and_transfers_pending(monkeypatch, caplog):
    ns = {"logger": logging.getLogger("pdo-prefill-test")}
    exec(nixl_patch.PREFILL_TAIL, ns)
    wait, mark = ns["_pdo_wait_polling_transfers"], ns["_pdo_mark"]

    class Event:
        def __init__(self, ready_after):
            self.queries, self.ready_after = 0, ready_after

        def query(self):
            self.queries += 1
            return self.queries > self.ready_after

    class Result:
        def __init__(self, ready_after):
            self.copy_done = Event(ready_after)

    class Args:
        tp_size, pp_size, attn_cp_size, enable_dp_attention = 1, 1, 1, False

    class Sched:
        server_args = Args()

        def __init__(self, ready_after=3, pending=5, done_after=None):
            self.result_queue = [("batch", Result(ready_after))]
            self.disagg_prefill_inflight_queue = ["req"] * pending
            self.polls, self.done_after = 0, done_after

        def process_disagg_prefill_inflight_queue(self):
            self.polls += 1
            if self.done_after is not None and self.polls >= self.done_after:
                self.disagg_prefill_inflight_queue = []

    def queries(s):
        return s.result_queue[0][1].copy_done.queries

    monkeypatch.delenv("PDO_NIXL_PREFILL_POLL_FILE", raising=False)
    monkeypatch.delenv("PDO_NIXL_PREFILL_POLL", raising=False)
    s = Sched()
    wait(s)
    assert (s.polls, queries(s), s._pdo_marks["done_at_top"]) == (0, 1, 0)   # off: only looked, as shipped
    monkeypatch.setenv("PDO_NIXL_PREFILL_POLL", "1")
    s = Sched()
    wait(s)
    assert (s.polls, queries(s), s._pdo_marks["polls"]) == (2, 4, 2)          # on: polled until the batch was done
    s = Sched(ready_after=100, done_after=2)
    wait(s)
    assert (s.polls, queries(s)) == (2, 3)                                     # stops once no transfer is left
    s = Sched(pending=0)
    wait(s)
    assert (s.polls, queries(s)) == (0, 1)                                     # nothing in flight: no wait
    s = Sched()
    s.server_args = type("TP2", (Args,), {"tp_size": 2})()
    wait(s)
    assert s.polls == 0                                                        # TP 2: every rank must poll alike
    # the next iteration logs where the one that ran a batch spent its time
    for name in ("run0", "run1", "res0", "res1", "poll1"):
        mark(s, name)
    with caplog.at_level(logging.INFO, logger="pdo-prefill-test"):
        wait(s)
    line = next(r.getMessage() for r in caplog.records if "PDO_ITER" in r.getMessage())
    assert "running_done_at_top=0" in line and "inflight=5" in line and "run_ms=" in line
    it = kvtimeline.iterations(line + "\n" + line.replace("running_done_at_top=0", "running_done_at_top=1"))
    assert it["iterations"] == 2 and it["running_done_at_top_frac"] == 0.5 and it["run_ms_p50"] >= 0


def test_prometheus_histogram_deltas():
    before = prom_sums('sglang:kv_transfer_latency_ms_sum{a="1"} 100.0\nsglang:kv_transfer_latency_ms_count{a="1"} 2\n')
    after = prom_sums('# HELP x\nsglang:kv_transfer_latency_ms_sum{a="1"} 400.0\n'
                      'sglang:kv_transfer_latency_ms_count{a="1"} 5\n')
    d = kv_delta(before, after)
    assert d["kv_transfer_latency_ms_count"] == 3 and d["kv_transfer_latency_ms_mean"] == 100.0
    assert d["kv_transfer_speed_gb_s_mean"] is None


def test_logprob_comparison_sees_a_wrong_prompt():
    def tops(shift):
        return [{"top": [[(t + shift + i, -11.5 - 0.01 * t - 0.003 * i) for t in range(5)] for _ in range(4)]}
                for i in range(3)]
    same = compare_logprobs(tops(0), tops(0), 8)
    assert same["steps_compared"] == 12 and same["max_abs_logprob_diff"] == 0.0 and same["top1_agree"] == 12
    control = cross_prompt_control(tops(0), 8)
    assert control["max_abs_logprob_diff"] > 0 and control["top1_agree"] < 12
    # missing steps (PD without the first token's entry) are skipped, not counted as agreement
    gap = [{"top": [[]] + p["top"][1:]} for p in tops(0)]
    assert compare_logprobs(gap, tops(0), 8)["steps_compared"] == 9


H100 = Path(__file__).resolve().parents[2] / "benchmarks/results/2026-11-24-calibration-h100-v2lite"


def test_cold_and_warm_start_of_the_committed_h100_run():
    with tarfile.open(H100 / "logs-v2lite.tar.xz") as tf:
        cold = logparse.startup(tf.extractfile("v2lite/server-v2lite-cold-default.log").read().decode())
        warm = logparse.startup(tf.extractfile("v2lite/server-v2lite-warm-default.log").read().decode())
    assert cold["engine_timings_s"]["cuda_graph"]["decode"] == 78.25
    assert warm["engine_timings_s"]["cuda_graph"]["decode"] == 14.79
    assert cold["limits"]["max_total_num_tokens"] == warm["limits"]["max_total_num_tokens"] == 1245248
    assert len(cold["cuda_graphs"][0]["bs"]) == 36 and cold["cuda_graphs"][0]["bs"][-1] == 256


def test_pd_orchestrator_calibrate_is_registered():
    from orchestrator.calibrate import command
    from orchestrator.cli import build_parser

    args = build_parser().parse_args(["calibrate", "pd", "--model-path", "m", "--out", "o", "--budget-s", "60",
                                      "--prefill-gpu", "0", "--decode-gpu", "1", "--flag=--trust-remote-code"])
    assert args.func is command.run and args.cmd == "pd"
    assert (args.prefill_gpu, args.decode_gpu, args.flag) == (0, 1, ["--trust-remote-code"])


def test_wait_log_sees_a_line_and_a_dead_server(tmp_path):
    import sys

    from orchestrator.calibrate.server import ServerDied, SglangServer

    srv = SglangServer("fake", "m", 1, tmp_path / "a.log", [])
    srv.argv = [sys.executable, "-c", "import time; print('Memory pool end. avail mem=1 GB', flush=True); time.sleep(30)"]
    srv.start()
    try:
        assert 0 <= srv.wait_log("Memory pool end", 20) < 20
        with pytest.raises(TimeoutError, match="no 'never printed'"):
            srv.wait_log("never printed", 1)
    finally:
        srv.stop(grace_s=2)
    dead = SglangServer("dead", "m", 1, tmp_path / "b.log", [])
    dead.argv = [sys.executable, "-c", "print('Traceback: boom'); raise SystemExit(3)"]
    dead.start()
    with pytest.raises(ServerDied, match="(?s)exited with 3 before 'Memory pool end'.*boom"):
        dead.wait_log("Memory pool end", 20)
