"""`plan` on a closed-loop workload: per-N rows, the gate, the best N, time to ready, and `--json` for tools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main

ROOT = Path(__file__).resolve().parents[2]
QWEN = str(ROOT / "configs" / "qwen3-pd-2026.yaml")
# a short window and a lenient SLO so the gate passes at low N and fails at high N on the simulated H100s
SHORT = ["--set", "benchmark.window_s=20", "--set", "benchmark.grace_s=20", "--set", "benchmark.slo.itl_ms=45",
         "--set", "benchmark.slo.ttft_ms=1000"]


def test_plan_prints_per_n_rows_the_gate_and_the_largest_passing_n(capsys, tmp_path):
    out_json = tmp_path / "rows" / "plan.json"
    code = main(["plan", "--config", QWEN, *SHORT, "--concurrency", "8,16,48", "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = {int(line.split()[0]): line for line in out.splitlines() if line.strip() and line.split()[0].isdigit()}
    assert set(rows) == {8, 16, 48}  # --concurrency overrides the config's list
    assert rows[8].endswith("PASS") and rows[48].endswith("FAIL")
    data = json.loads(out_json.read_text())
    assert [r["concurrency"] for r in data["rows"]] == [8, 16, 48]
    for r in data["rows"]:
        assert {"concurrency", "output_tok_s", "good_output_tok_s", "good_fraction", "ttft_ms", "itl_ms"} <= set(r)
        assert set(r["ttft_ms"]) == set(r["itl_ms"]) == {"p50", "p90", "p99"}
        assert r["good_output_tok_s"] == pytest.approx(r["output_tok_s"] * r["good_fraction"], rel=1e-9)
    passing = [r["concurrency"] for r in data["rows"] if r["clears_gate"]]
    assert data["largest_passing_concurrency"] == max(passing)
    assert f"largest N clearing the gate (good fraction >= 0.90): {max(passing)}" in out
    assert data["time_to_ready"]["ready_s"] > data["time_to_ready"]["placement_s"] > 0
    # the contest loads the published checkpoint (the organisers' script: no --load-format dummy)
    assert "predicted time to ready on H100-SXM with SGLang, weights read at 2 GB/s per node: " in out
    # Qwen3's band is the closed-loop back-test's (the organisers' measured points), not R1's batch band;
    # what is uncalibrated is named per group
    assert data["error_band"].startswith("closed-loop back-test of qwen3-235b-a22b-fp8: output tok/s ±")
    assert "measured points, out of sample" in out and "roofline cost model" in out


def test_a_model_without_back_test_rows_says_so_instead_of_a_band(capsys):
    code = main(["plan", "--config", QWEN, "--set", "rules=none", "--set", "model.preset=DeepSeek-V2-Lite",
                 "--set", "model.quantization=bf16", "--set", "benchmark.window_s=5", "--concurrency", "8"])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    assert "back-test error band: no out-of-sample rows yet for DeepSeek-V2-Lite" in out


def test_plan_on_an_aggregated_closed_loop_and_no_passing_n_exits_1(capsys):
    agg = ["--set", "layout.mode=aggregated", "--set", "layout.prefill=[]", "--set", "layout.decode=[]",
           "--set", "layout.aggregated=[{tp: 8, node_role: prefill}, {tp: 8, node_role: decode}]", "--set", "benchmark.window_s=10"]
    code = main(["plan", "--config", QWEN, *agg, "--concurrency", "64"])
    out = capsys.readouterr().out
    assert code == 1 and "agg:1AxTP8+1AxTP8" in out and "no N clears the gate" in out


@pytest.mark.parametrize("argv, message", [
    (["--concurrency", "8,x"], "--concurrency '8,x': give positive integers, e.g. --concurrency 24,32,48"),
    (["--concurrency", "0"], "--concurrency '0': give positive integers"),
])
def test_bad_concurrency_is_one_line(capsys, argv, message):
    assert main(["plan", "--config", QWEN, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_closed_loop_flags_on_a_batch_workload_say_how_to_get_one(capsys):
    assert main(["plan", "--config", str(ROOT / "configs" / "default.yaml"), "--json", "x.json"]) == 2
    err = capsys.readouterr().err
    assert "--json applies to closed-loop workloads; set benchmark.kind: closed_loop" in err


def test_compare_ab_tests_pd_against_aggregated_under_the_first_configs_closed_loop(capsys, tmp_path):
    from orchestrator.config import dump_config, load_config

    agg = load_config(QWEN, ["name=agg", "rules=none", "layout.mode=aggregated", "layout.prefill=[]",
                             "layout.decode=[]", "layout.aggregated=[{tp: 8, node_role: prefill}, "
                             "{tp: 8, node_role: decode}]", "benchmark.concurrency=[99]", "benchmark.slo.itl_ms=5"])
    path = tmp_path / "agg.yaml"
    path.write_text(dump_config(agg))
    code = main(["compare", "--configs", QWEN, str(path), "--set", "benchmark.window_s=10",
                 "--set", "benchmark.slo.itl_ms=45"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    ns = load_config(QWEN).benchmark.concurrency
    # the second config runs the first one's N list and SLO (its own 99 and 5 ms are not used)
    assert [(int(r[0]), r[1]) for r in rows] == [(n, name) for n in ns for name in ("qwen3-pd-2026", "agg")]
    assert "ITL <= 45 ms" in out and all(r[-1] in ("PASS", "FAIL") for r in rows)
    assert any(line.startswith("agg: ") for line in out.splitlines())
    assert out.count("priced as round_robin") == 1
    assert ("\n  router.policy priced as round_robin, one turn shared by both roles, for: qwen3-pd-2026 (prefix_aware; "
            "2 prefill, 2 decode servers), agg (prefix_aware; 2 aggregated servers); ") in out


def test_compare_real_on_a_closed_loop_points_to_serve_and_goodput(capsys):
    assert main(["compare", "--configs", QWEN, QWEN, "--real"]) == 2
    assert "`serve` + `goodput`" in capsys.readouterr().err


def test_plan_names_what_prices_a_qwen3_pair_sharing_one_gpu(capsys):
    code = main(["plan", "--config", str(ROOT / "configs" / "device-h100x1-qwen3-serve.yaml"), "--concurrency", "4"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "decode-0-0 and prefill-0-0 share one GPU (cluster.local.gpu_split: off): their forwards time-slice it" in out
    assert "layout.prefill.0: forwards from the roofline cost model; prefill at the shares of peak of h100-sxm-r1s6" in out
    code = main(["plan", "--config", str(ROOT / "configs" / "device-h200x2-qwen3-serve.yaml"), "--concurrency", "4"])
    assert code == 0 and "share one GPU" not in capsys.readouterr().out  # a GPU per server
