"""The two-GPU calibration (issue 25; run in issue 29) without GPUs: its help, argument checks, dry run, plan,
and that its driver stays stdlib only like the rest of orchestrator/calibrate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.calibrate.command import main
from orchestrator.calibrate.twogpu import LAYOUTS, collectives_command, plan, pp_bubble

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
    assert "server pp2: sglang.launch_server --pp-size 2 --mem-fraction-static 0.70 --trust-remote-code" in out
    assert "server tp2: sglang.launch_server --tp-size 2" in out and "dpattn2-ep2" not in out
    assert "torch.distributed.run --standalone --nproc-per-node 2" in out and "collectives_bench.py" in out


def test_the_plan_measures_each_layout_and_the_bubble_comes_from_prefill_latencies() -> None:
    variants = plan(list(LAYOUTS))
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
