"""The two-GPU calibration (issue 25; run in issue 29) without GPUs: its help, argument checks, dry run, plan,
and that its driver stays stdlib only like the rest of orchestrator/calibrate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.calibrate.command import main
from orchestrator.calibrate.twogpu import collectives_command, plan, pp_bubble

ROOT = Path(__file__).resolve().parents[2]
R1S = ROOT / "benchmarks/calibration/r1-shaped"


def test_help_names_the_layouts_and_the_measurements() -> None:
    out = subprocess.run([sys.executable, "-m", "orchestrator.calibrate", "twogpu", "--help"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    for word in ("--layouts", "--budget-s", "--dry-run", "--collective-tokens", "tp2, dpattn2-ep2, pp2"):
        assert word in out


@pytest.mark.parametrize("args, message", [
    (["--layouts", "tp4"], "--layouts 'tp4': unknown ['tp4']; use a comma-separated subset of tp2,dpattn2-ep2,pp2"),
    (["--layouts", ","], "--layouts ',': unknown empty"),
    (["--budget-s", "60"], "--budget-s 60: two server starts alone take minutes; give at least 120 s"),
    (["--collective-tokens", "8,x"], "--collective-tokens '8,x': not a comma-separated list of integers"),
    (["--collective-tokens", "0"], "--collective-tokens '0': token counts must be >= 1"),
    (["--model-path", "/nonexistent"], "--model-path /nonexistent: no config.json there"),
])
def test_bad_arguments_get_one_line_naming_the_flag(args, message, tmp_path, capsys) -> None:
    base = {"--model-path": str(R1S), "--out": str(tmp_path), "--budget-s": "540"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    rc = main(["twogpu", *[x for kv in base.items() for x in kv]])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("calibrate twogpu: ") and message in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing written, nothing started


def test_dry_run_prints_every_server_and_the_collectives_and_starts_nothing(tmp_path, capsys) -> None:
    rc = main(["twogpu", "--model-path", str(R1S), "--out", str(tmp_path / "o"), "--budget-s", "540", "--dry-run",
               "--layouts", "pp2,tp2", "--flag=--trust-remote-code"])
    out = capsys.readouterr().out
    assert rc == 0 and not (tmp_path / "o").exists()
    assert ("server pp2: sglang.launch_server --pp-size 2 --mem-fraction-static 0.70 --cuda-graph-max-bs-decode 512 "
            "--cuda-graph-bs-decode 1 8 16 32 64 128 256 512 --trust-remote-code") in out
    assert "server tp2: sglang.launch_server --tp-size 2" in out and "dpattn2-ep2" not in out
    assert "torch.distributed.run --standalone --nproc-per-node 2" in out and "collectives_bench.py" in out


def test_the_plan_measures_each_layout_and_the_bubble_comes_from_prefill_latencies() -> None:
    variants = plan(["tp2", "dpattn2-ep2", "pp2"])
    assert [v["name"] for v in variants] == ["tp2", "dpattn2-ep2", "pp2"]
    assert variants[1]["flags"][:7] == ["--tp-size", "2", "--dp-size", "2", "--enable-dp-attention", "--ep-size", "2"]
    assert all(v["measure"] == ["prefill", "decode", "context"] for v in variants)
    rows = [{"concurrency": 1, "input_tokens": 1024, "latency_s_median": 0.10},
            {"concurrency": 4, "input_tokens": 1024, "latency_s_median": 0.25}]
    assert pp_bubble(rows) == {"4x1024": 1.6}  # 4 chunks in 0.25 s: 0.0625 s each against 0.10 s alone
    cmd = collectives_command(Path("/o"), 7168, [1, 8192], python="python3")
    assert cmd[-4:] == ["--hidden", "7168", "--tokens", "1,8192"]
    assert (ROOT / "scripts/device/collectives_bench.py").is_file()


def test_the_driver_imports_nothing_outside_the_standard_library() -> None:
    code = ("import sys; import orchestrator.calibrate.twogpu, orchestrator.calibrate.command; "
            "bad = [m for m in ('pydantic', 'yaml', 'numpy', 'torch', 'httpx', 'ray') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    json.loads(json.dumps(plan(["tp2"])))  # the plan is plain data (it goes into the raw JSON)


def _decode_line(sec: int, ranks: str, running: int, gen: float) -> str:
    prefix = f" {ranks}" if ranks else ""
    return (f"[2026-11-26 06:00:{sec:02d}{prefix}] Decode batch, #running-req: {running}, #token: {running * 300}, "
            f"token usage: 0.01, cuda graph: True, gen throughput (token/s): {gen:.2f}, #queue-req: 0")


def test_decode_lines_of_multi_rank_servers_are_read_with_their_ranks() -> None:
    # SGLang prefixes a scheduler's stamp with its ranks when a server has several ([stamp TP0], [stamp DP1 TP1]);
    # before issue 29 such lines did not parse at all, so every TP2 / DP / PP step came out None
    from orchestrator.calibrate import logparse

    tp = "\n".join(_decode_line(s, "TP0", 64, 64 / 0.005) for s in range(5))   # 64 running, 5 ms a step
    rows = logparse.decode_lines(tp)
    assert len(rows) == 5 and rows[0]["ranks"] == "TP0"
    got = logparse.decode_step(rows, 64)
    assert got["step_ms_median"] == 5.0 and got["samples"] == 4 and got["estimator"].startswith("one stream")
    # DP attention: each DP rank logs its own half of the batch and its own throughput; they step together
    dp = "\n".join(_decode_line(s, f"DP{r} TP{r} EP{r}", 32, 32 / 0.006) for s in range(4) for r in (0, 1))
    got = logparse.decode_step(logparse.decode_lines(dp), 64)
    assert got["step_ms_median"] == 6.0 and set(got["streams"]) == {"DP0", "DP1"} and got["samples"] == 6
    # pipeline stages: a line names one micro-batch (30 or 34 requests) but counts every micro-batch's tokens
    pp = "\n".join(_decode_line(s, f"PP{p} TP0", 30 + 4 * (s % 2), 64 / 0.008) for s in range(6) for p in (0, 1))
    got = logparse.decode_step(logparse.decode_lines(pp), 64)
    assert got["step_ms_median"] == 8.0 and got["estimator"].startswith("pipeline") and got["samples"] == 8
    # a rank-prefixed line still marks start-up phases
    st = logparse.startup("[2026-11-26 06:00:01 TP0] Load weight begin. avail mem=70.00 GB\n"
                          "[2026-11-26 06:00:09 TP1] The server is fired up and ready to roll!")
    assert st["marks_s"] == {"load_weight_begin": 0.0, "ready": 8.0}


def test_the_plan_captures_graphs_only_at_the_measured_decode_batches() -> None:
    from orchestrator.calibrate.twogpu import DECODE_BATCHES, GRAPH_BATCHES

    variant = plan(["pp2"])[0]
    flags = variant["flags"]
    listed = flags[flags.index("--cuda-graph-bs-decode") + 1:]
    assert [int(b) for b in listed] == GRAPH_BATCHES and set(DECODE_BATCHES) | {16} == set(GRAPH_BATCHES)
    assert variant["decode_batches"] == DECODE_BATCHES and variant["min_left_s"] >= 120


class _FakeServer:
    """Stands in for SglangServer: answers at once and logs `Decode batch` lines as a server of the layout would."""

    def __init__(self, name, model_path, port, log_path, flags, env=None):
        self.name, self.url, self.log_path, self.flags = name, f"http://127.0.0.1:{port}", Path(log_path), flags
        self.argv, self.launched_at, self.lines = ["python3", "-m", "sglang.launch_server", *flags], 0.0, []

    def start(self):
        return self

    def wait_ready(self, timeout_s):
        return 1.0

    def get_json(self, path):
        dp = 2 if "--enable-dp-attention" in self.flags else 1
        return {"context_length": 16384, "internal_states": [{"effective_max_running_requests_per_dp": 4096 // dp}]}

    def log_size(self):
        return len(self.lines)

    def log_since(self, offset):
        return "\n".join(self.lines[offset:])

    def log_text(self):
        return "\n".join(self.lines)

    def alive(self):
        return True

    def stop(self):
        pass


def test_a_twogpu_run_measures_every_layout_with_its_own_points(tmp_path, monkeypatch) -> None:
    from orchestrator.calibrate import single, twogpu

    servers = []

    def fake_server(*args, **kwargs):
        servers.append(_FakeServer(*args, **kwargs))
        return servers[-1]

    def fake_generate(url, prompts, max_new_tokens):
        srv = servers[-1]
        if max_new_tokens > 1:  # a decode point: 10 log lines at a 4 ms step, as each layout's ranks print them
            b = len(prompts)
            for s in range(10):
                if "--enable-dp-attention" in srv.flags:
                    srv.lines += [_decode_line(s, f"DP{r} TP{r} EP{r}", max(1, b // 2), max(1, b // 2) / 0.004)
                                  for r in (0, 1)]
                elif "--pp-size" in srv.flags:
                    srv.lines += [_decode_line(s, f"PP{p} TP0", max(1, b // 2), b / 0.004) for p in (0, 1)]
                else:
                    srv.lines.append(_decode_line(s, "TP0", b, b / 0.004))
        rows = [{"error": None} for _ in prompts]
        return {"n": len(prompts), "ok": len(prompts), "wall_s": 0.01, "latency_s_max": 0.01 * len(prompts),
                "rows": rows}

    monkeypatch.setattr(single, "SglangServer", fake_server)
    monkeypatch.setattr(single, "generate_many", fake_generate)
    monkeypatch.setattr(single, "gpu_memory_used_mib", lambda: None)
    res = twogpu.run_twogpu(str(R1S), tmp_path, 600, ["tp2", "pp2", "dpattn2-ep2"], [1], collectives=False)
    assert [r["variant"] for r in res["runs"]] == ["tp2", "pp2", "dpattn2-ep2"]
    for run in res["runs"]:
        assert [p["input_tokens"] for p in run["prefill"]] == [256, 1024, 4096, 8192, 16000, 1024, 1024, 4096]
        assert [d["batch_size"] for d in run["decode"]] == twogpu.DECODE_BATCHES
        assert all(d["step_ms_median"] == 4.0 and d["decode_lines"] for d in run["decode"]), run["variant"]
        assert [c["context_tokens"] for c in run["context"]] == twogpu.CONTEXT_LENGTHS
    assert res["runs"][1]["pp_bubble"] == {"4x1024": 1.0, "16x1024": 1.0, "8x4096": 1.0}  # k chunks took k x one
    saved = json.loads((tmp_path / "calibration-twogpu.json").read_text())
    assert saved["runs"][2]["decode"][0]["estimator"].startswith("DP ranks")


def test_the_eager_tp2_and_the_pp2_tail_measure_only_their_own_points(tmp_path, capsys) -> None:
    # issue 25 (h25eager): an eager TP2 decode step needs TP2 without CUDA graphs, the fusion still off; pp2-tail
    # measures what the first pp2 run's budget cut off (decode batch 512, context) with pp2's flags and graphs
    eager, tail = plan(["tp2-eager", "pp2-tail"])
    assert "--disable-cuda-graph" in eager["flags"] and "--enforce-disable-flashinfer-allreduce-fusion" in eager["flags"]
    assert not any(f.startswith("--cuda-graph") for f in eager["flags"])
    assert eager["measure"] == ["decode", "context"] and eager["decode_batches"] == plan(["tp2"])[0]["decode_batches"]
    assert tail["flags"] == plan(["pp2"])[0]["flags"]
    assert tail["measure"] == ["decode", "context"] and tail["decode_batches"] == [512]
    rc = main(["twogpu", "--model-path", str(R1S), "--out", str(tmp_path / "o"), "--budget-s", "540", "--dry-run",
               "--layouts", "tp2-eager,pp2-tail", "--no-collectives"])
    out = capsys.readouterr().out
    assert rc == 0 and ("server tp2-eager: sglang.launch_server --tp-size 2 --enforce-disable-flashinfer-allreduce-fusion "
                        "--disable-cuda-graph --mem-fraction-static 0.70; measure decode, context (decode B [1, 8, 32, 64,"
                        " 128, 256, 512]; context B=16 C [256, 2048, 8192]); each decode/context point 2 times in a row") in out
    assert ("measure decode, context (decode B [512]; context B=16 C [256, 2048, 8192])") in out
    assert "prefill L" not in out


def test_eager_tp2_measures_each_point_twice_in_a_row_with_fresh_prompts(tmp_path, monkeypatch) -> None:
    # lease 3 (issue 25): the first use of a shape against a warm repeat of the same point, so a first-use stall
    # (the 0.2-4.1 s the lease-2 walls held beyond their steps) separates from the steady step
    from orchestrator.calibrate import single, twogpu

    servers, prompts_seen = [], []

    def fake_server(*args, **kwargs):
        servers.append(_FakeServer(*args, **kwargs))
        return servers[-1]

    def fake_generate(url, prompts, max_new_tokens):
        prompts_seen.append(prompts[0])
        servers[-1].lines += [_decode_line(s, "TP0", len(prompts), len(prompts) / 0.004) for s in range(10)]
        return {"n": len(prompts), "ok": len(prompts), "wall_s": 0.01, "latency_s_max": 0.01,
                "rows": [{"error": None} for _ in prompts]}

    monkeypatch.setattr(single, "SglangServer", fake_server)
    monkeypatch.setattr(single, "generate_many", fake_generate)
    monkeypatch.setattr(single, "gpu_memory_used_mib", lambda: None)
    (run,) = twogpu.run_twogpu(str(R1S), tmp_path, 600, ["tp2-eager"], [1], collectives=False)["runs"]
    assert [(d["batch_size"], d["repeat"]) for d in run["decode"]] == [(b, r) for b in twogpu.DECODE_BATCHES for r in (0, 1)]
    assert [(c["context_tokens"], c["repeat"]) for c in run["context"]] == [(c, r) for c in twogpu.CONTEXT_LENGTHS
                                                                             for r in (0, 1)]
    assert all(d["step_ms_median"] == 4.0 for d in run["decode"] + run["context"])
    assert len(set(map(tuple, prompts_seen))) == len(prompts_seen)   # a repeat sends new prompts: no prefix-cache hit
    # the graphed layouts measure each point once, as before
    assert all(v["repeats"] == 1 for v in plan(["tp2", "pp2", "dpattn2-ep2", "pp2-tail"]))
