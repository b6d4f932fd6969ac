"""The in-run eager measurement's device scripts, dry (no GPU): the CPU sampler sees a busy thread, the lone-server
driver reads steps from SGLang's decode lines and keeps the pinned scheduler's core free, the call script checks
its phase and builds the flags the pre-registration names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts/device"))

import cpu_sampler  # noqa: E402
import eager_lone  # noqa: E402


def test_the_sampler_records_the_host_once_and_a_busy_thread_in_its_samples(tmp_path) -> None:
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<3: pass"])
    try:
        out = tmp_path / "cpu.jsonl"
        assert cpu_sampler.main(["--out", str(out), "--interval-s", "0.5", "--duration-s", "1.6", "--gpu-every", "0"]) == 0
    finally:
        busy.kill()
        busy.wait()
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["kind"] for x in lines].count("host") == 1
    host = lines[0]
    assert host["nproc"] == os.cpu_count() and "cpu0" in host["siblings"] and host["clk_tck"] > 0
    samples = [x for x in lines if x["kind"] == "sample"]
    assert len(samples) >= 2
    assert all(len(s["cpu"]["cpu0"]) == len(cpu_sampler.STAT_FIELDS) for s in samples)
    ran = [t for s in samples for t in s["threads"] if t[0] == busy.pid]
    assert ran and all(t[3] > 0 and 0 <= t[4] < os.cpu_count() for t in ran)   # ticks used, last CPU a real one
    assert any(x["kind"] == "proc" and x["pid"] == busy.pid and "time.time()" in x["cmdline"] for x in lines)


def test_the_sampler_refuses_a_zero_interval(tmp_path) -> None:
    with pytest.raises(SystemExit) as err:
        cpu_sampler.main(["--out", str(tmp_path / "x"), "--interval-s", "0"])
    assert err.value.code == 2


LOG = """\
[2026-11-26 19:22:09] Prefill batch, #new-seq: 25, #new-token: 8250, #cached-token: 0, token usage: 0.01, #running-req: 275, #queue-req: 25,
[2026-11-26 19:22:10] Decode batch, #running-req: 300, #token: 99300, token usage: 0.13, cuda graph: False, gen throughput (token/s): 900.00, #queue-req: 0,
[2026-11-26 19:22:11] Decode batch, #running-req: 300, #token: 102300, token usage: 0.14, cuda graph: False, gen throughput (token/s): 5000.00, #queue-req: 0,
[2026-11-26 19:22:12] Decode batch, #running-req: 300, #token: 105300, token usage: 0.14, cuda graph: False, gen throughput (token/s): 6000.00, #queue-req: 0,
[2026-11-26 19:22:13] Decode batch, #running-req: 300, #token: 108300, token usage: 0.15, cuda graph: False, gen throughput (token/s): 4000.00, #queue-req: 0,
[2026-11-26 19:22:14] Decode batch, #running-req: 120, #token: 40000, token usage: 0.05, cuda graph: True, gen throughput (token/s): 9000.00, #queue-req: 0,
"""


def test_a_round_s_step_drops_the_first_decode_line_and_the_shrinking_tail() -> None:
    steps = eager_lone.steady_steps(LOG, 300)
    assert len(steps["lines"]) == 5
    assert steps["steady"] == 3 and steps["eager"] is True   # 900 tok/s (prefills inside) and the 120-running tail out
    assert steps["step_ms_median"] == pytest.approx(60.0)      # 300 / 5000 tok/s
    assert (steps["step_ms_min"], steps["step_ms_max"]) == (pytest.approx(50.0), pytest.approx(75.0))


def test_the_pinned_scheduler_s_core_holds_no_spinner_and_nothing_else() -> None:
    allowed = os.sched_getaffinity(0)
    plan = eager_lone.pin_plan(allowed, spinners=6)
    core = set(plan["main_core"])
    assert plan["main_cpu"] in core and core <= allowed
    assert not core & set(plan["spinner_cpus"]) and not core & set(plan["rest"])
    if len(allowed) > 1:
        assert plan["main_cpu"] != 0 and plan["rest"]


def test_the_driver_refuses_an_unknown_variant_or_an_empty_batch_list() -> None:
    for bad in (["--variants", "alone,turbo"], ["--batches", ","]):
        with pytest.raises(SystemExit) as err:
            eager_lone.main(["--url", "http://127.0.0.1:1", "--log", "/dev/null", "--server-pid", "1", "--out", "/dev/null", *bad])
        assert err.value.code == 2


def test_the_call_script_checks_its_phase_and_passes_the_pre_registered_flags() -> None:
    script = ROOT / "scripts/device/eager_inrun.sh"
    bad = subprocess.run(["bash", str(script), "turbo"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "unknown phase" in bad.stderr
    dry = subprocess.run(["bash", str(script), "ab"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "DRY_RUN": "1"})
    assert dry.returncode == 0, dry.stderr
    a, b, tp2 = dry.stdout.splitlines()
    assert "layout.decode.0.mem_fraction_static=0.65" in a and 'SGLANG_LOG_GC="1"' in a and "--decode-log-interval" in a
    assert "layout.aggregated.0.tp=1" in b and "--gpu 1 " in b and "--spinners 6" in b
    assert "--gpu 0,1 " in tp2 and "mem_fraction_static=0.80" in tp2


def test_the_flags_load_into_the_configs_the_servers_start_from() -> None:
    from orchestrator.config import load_config

    logargs = '[--sampling-backend,pytorch,--log-level,info,--decode-log-interval,"10"]'
    cfg = load_config(ROOT / "configs/device-h200x2-local-1p1d.yaml",
                      ["layout.decode.0.mem_fraction_static=0.65", 'engine.sglang.env.SGLANG_LOG_GC="1"',
                       f"engine.sglang.extra_args={logargs}"])
    assert cfg.engine.sglang.env["SGLANG_LOG_GC"] == "1"
    assert cfg.engine.sglang.extra_args[-2:] == ["--decode-log-interval", "10"]
