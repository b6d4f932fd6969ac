"""`calibrate single --dry-run` and the graph-padding plan (issue 25, hctx): what the one-GPU call will start,
checked here before the device call sends it."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.calibrate.command import main

ROOT = Path(__file__).resolve().parents[2]
R1S = ROOT / "benchmarks/calibration/r1-shaped"
PLAN = ROOT / "benchmarks/calibration/plans/r1-graph-padding.json"
TP1_EAGER = ROOT / "benchmarks/calibration/plans/r1-tp1-eager.json"


def _servers(text: str) -> dict[str, str]:
    return {line.split()[1]: line for line in text.splitlines() if line.startswith("server ")}


def test_graph_padding_plan_starts_two_servers_that_differ_only_in_the_batch_16_graph(tmp_path, capsys) -> None:
    rc = main(["single", "--model-path", str(R1S), "--name", "r1s6-graphpad", "--out", str(tmp_path / "o"),
               "--budget-s", "500", "--plan-json", str(PLAN), "--dry-run", "--flag=--trust-remote-code",
               "--flag=--triton-attention-split-tile-size", "--flag=256"])
    out = capsys.readouterr().out
    assert rc == 0 and not (tmp_path / "o").exists()   # nothing written, nothing started
    servers = _servers(out)
    assert list(servers) == ["graphs-with-16", "graphs-without-16"]
    with16, without16 = servers["graphs-with-16"], servers["graphs-without-16"]
    assert "--cuda-graph-bs-decode 1 8 16 32 64;" in with16 and "--cuda-graph-bs-decode 1 8 32 64;" in without16
    for line in (with16, without16):   # the flags of the existing R1-shaped calibrations
        for flag in ("--load-format dummy", "--attention-backend triton", "--mem-fraction-static 0.70",
                     "--triton-attention-split-tile-size 256", "--context-length 16384"):
            assert flag in line
        assert "measure context B=16 C [256, 2048, 8192]" in line
    # besides the graph list the two starts are the same server
    assert with16.replace(" 16 32 64;", " 32 64;").replace("with-16 (cold)", "without-16 (warm)") == without16


def test_dry_run_of_the_default_plan_names_its_three_starts(tmp_path, capsys) -> None:
    rc = main(["single", "--model-path", str(R1S), "--name", "x", "--out", str(tmp_path), "--budget-s", "60",
               "--dry-run"])
    assert rc == 0 and list(_servers(capsys.readouterr().out)) == ["cold-default", "warm-default", "knobs"]


def test_the_plan_is_plain_json_with_known_measurements() -> None:
    for plan_path in (PLAN, TP1_EAGER):
        for variant in json.loads(plan_path.read_text()):
            assert set(variant["measure"]) <= {"prefill", "decode", "context", "beyond"}


def test_the_tp1_eager_plan_is_the_eager_tp2_server_without_its_tp_flags(tmp_path, capsys) -> None:
    # lease 3 (issue 25): eager TP1 on one GPU of the two-GPU host against eager TP2 there, point for point
    from orchestrator.calibrate.twogpu import LAYOUTS, plan

    (tp1,) = json.loads(TP1_EAGER.read_text())
    (tp2,) = plan(["tp2-eager"])
    tp_only = LAYOUTS["tp2"]   # --tp-size 2 and the all-reduce fusion switch
    assert tp1["flags"] == [f for f in tp2["flags"] if f not in tp_only]
    for key in ("measure", "decode_batches", "context_lengths", "repeats"):
        assert tp1[key] == tp2[key], key
    rc = main(["single", "--model-path", str(R1S), "--name", "r1s6-tp1-eager", "--out", str(tmp_path / "o"),
               "--budget-s", "500", "--plan-json", str(TP1_EAGER), "--dry-run", "--flag=--trust-remote-code",
               "--flag=--triton-attention-split-tile-size", "--flag=256"])
    line = _servers(capsys.readouterr().out)["tp1-eager"]
    assert rc == 0 and "--disable-cuda-graph --mem-fraction-static 0.70;" in line and "--tp-size" not in line
    assert "each decode/context point 2 times in a row" in line
