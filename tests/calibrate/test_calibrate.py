"""The calibration harness's pure parts, on real SGLang logs recorded on the GPU machines (no GPU needed)."""

from __future__ import annotations

import logging
import tarfile
import threading
import time
from pathlib import Path

import pytest

from orchestrator.calibrate import logparse, nixl_patch
from orchestrator.calibrate.pd import chunk_stats, compare_logprobs, cross_prompt_control, kv_delta, prom_sums

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


def _anchored_source() -> str:
    # every anchor once, in a module shaped like the real one (imports + logger the tail relies on)
    body = "".join(old for old, _ in nixl_patch.EDITS)
    return "import threading\nimport time\nimport logging\nlogger = logging.getLogger('x')\n" + body


def test_nixl_patch_applies_once_and_is_idempotent():
    src = _anchored_source()
    out = nixl_patch.patch_text(src)
    assert nixl_patch.MARK in out and "and not _pdo_coalesce_kv()" in out
    assert out.count("_pdo_log_chunk(self, room, kv_chunk") == 1
    assert nixl_patch.patch_text(out) == out


def test_nixl_patch_refuses_a_changed_source():
    src = _anchored_source().replace("            not bypass_prepped\n", "            not skip_prepped\n")
    with pytest.raises(nixl_patch.PatchError, match="edit 1: anchor found 0 times"):
        nixl_patch.patch_text(src)
    doubled = _anchored_source() + nixl_patch.EDITS[0][0]
    with pytest.raises(nixl_patch.PatchError, match="edit 0: anchor found 2 times"):
        nixl_patch.patch_text(doubled)


def test_nixl_patch_toggle_follows_env_and_flag_file(tmp_path, monkeypatch, caplog):
    ns = {"time": time, "threading": threading, "logger": logging.getLogger("pdo-test")}
    exec(nixl_patch.TAIL, ns)
    flag = tmp_path / "on"
    monkeypatch.delenv("PDO_NIXL_COALESCE", raising=False)
    monkeypatch.setenv("PDO_NIXL_COALESCE_FILE", str(flag))
    assert ns["_pdo_coalesce_kv"]() is False
    flag.write_text("on")
    assert ns["_pdo_coalesce_kv"]() is True
    flag.unlink()
    monkeypatch.setenv("PDO_NIXL_COALESCE", "1")
    assert ns["_pdo_coalesce_kv"]() is True

    class Args:
        kv_item_lens = [1152] * 27

    class Mgr:
        kv_args = Args()

    class Chunk:
        prefill_kv_indices = list(range(100))
        chunk_id, is_last_chunk = 0, True

    ns["_PDO_TLS"].descs = 27
    with caplog.at_level(logging.INFO, logger="pdo-test"):
        ns["_pdo_log_chunk"](Mgr(), 42, Chunk(), time.perf_counter() - 0.002, time.perf_counter() - 0.001)
    st = chunk_stats(caplog.text)
    assert st["chunks"] == 1 and st["modes"] == ["coalesced"] and st["descs_mean"] == 27
    assert st["bytes_mean"] == 100 * 27 * 1152 and st["transfer_ms_per_request_median"] >= 2.0


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
