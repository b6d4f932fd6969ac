"""`goodput` takes its load from the config's closed-loop benchmark; each flag given overrides its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import build_parser
from orchestrator.cli.args import config_from_args
from orchestrator.cli.serving import closed_load
from orchestrator.run.aiperf import AiperfTool, profile_command

ROOT = Path(__file__).resolve().parents[2]
QWEN = str(ROOT / "configs" / "qwen3-pd-2026.yaml")


def _load(*argv: str):
    args = build_parser().parse_args(["goodput", "--config", QWEN, "--url", "http://127.0.0.1:1", *argv])
    return closed_load(config_from_args(args), args, args.url, 8)


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_goodput_defaults_are_the_configs_closed_loop_fields():
    slo = ["--set", "benchmark.slo.ttft_ms=2500", "--set", "benchmark.slo.min_good_fraction=0.95",
           "--set", "benchmark.window_s=90"]
    load = _load(*slo)
    assert (load.input_tokens, load.output_tokens, load.warmup_s, load.window_s, load.grace_s) == (4000, 200, 60, 90, 30)
    assert (load.ttft_ms, load.itl_ms, load.min_good_fraction, load.random_seed) == (2500, 20, 0.95, 2026)
    cmd = profile_command(AiperfTool(Path("/bin/aiperf"), Path("/tok")), load, Path("/out"))
    assert _flag(cmd, "--goodput") == "time_to_first_token:2500 inter_token_latency:20"
    assert _flag(cmd, "--benchmark-duration") == "90" and _flag(cmd, "--warmup-duration") == "60"


def test_goodput_flags_override_the_config():
    load = _load("--isl", "64", "--osl", "8", "--warmup-s", "0", "--window-s", "20", "--grace-s", "5",
                 "--ttft-ms", "900", "--itl-ms", "50")
    assert (load.input_tokens, load.output_tokens, load.warmup_s, load.window_s, load.grace_s) == (64, 8, 0, 20, 5)
    assert (load.ttft_ms, load.itl_ms) == (900, 50)
    cmd = profile_command(AiperfTool(Path("/bin/aiperf"), Path("/tok")), load, Path("/out"))
    assert "--warmup-duration" not in cmd and _flag(cmd, "--synthetic-input-tokens-mean") == "64"


def test_goodput_gate_is_the_configs_min_good_fraction():
    from orchestrator.run.goodput import GoodputRow
    from orchestrator.run.aiperf import ProfileSummary

    summary = ProfileSummary(100, 0, 1000.0, 0.92, 920.0, {}, {}, 4000, 200, {})
    assert GoodputRow(8, summary, Path("."), 0.90).clears_gate
    assert not GoodputRow(8, summary, Path("."), 0.95).clears_gate


@pytest.mark.parametrize("argv, says", [
    (["--isl", "-5"], "goodput: --isl -5: give a number above 0"),
    (["--window-s", "0"], "goodput: --window-s 0: give a number above 0"),
    (["--grace-s", "-1"], "goodput: --grace-s -1: give a number of at least 0"),
    (["--url", "http://127.0.0.1:1"], "goodput: --url http://127.0.0.1:1 does not answer (ConnectError"),
])
def test_a_load_aiperf_cannot_run_is_one_line_before_aiperf_starts(tmp_path, capsys, argv, says):
    """AIPerf refused these only after building its dataset (a pydantic box), or sent every request of its run into
    a connection error for the whole window; goodput then died in a traceback."""
    from orchestrator.cli import main

    argv = ["--url", "http://127.0.0.1:9", *argv] if "--url" not in argv else argv
    rc = main(["goodput", "--config", QWEN, "--concurrency", "2", "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(says) and "\n" not in err, err
    assert not (tmp_path / "out").exists()  # AIPerf (the real one, .venv-aiperf) was not started


def test_goodput_sends_the_gateways_api_key(monkeypatch):
    """A gateway with router.api_key_env answers 401 to a request without the key: AIPerf gets it (--api-key)."""
    monkeypatch.setenv("PDO_TEST_KEY", "s3cret")
    load = _load("--set", "router.api_key_env=PDO_TEST_KEY")
    cmd = profile_command(AiperfTool(Path("/bin/aiperf"), Path("/tok")), load, Path("/out"))
    assert _flag(cmd, "--api-key") == "s3cret"
    assert _load().api_key is None
