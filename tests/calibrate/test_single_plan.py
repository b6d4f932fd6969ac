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


LEASE4 = ROOT / "benchmarks/calibration/plans/lease4-twogpu.json"


def test_lease4_plan_reruns_the_dp_attention_server_logged_and_puts_tp2_beside_tp1(tmp_path, capsys) -> None:
    # lease 4 (issue 25): C = twogpu's dpattn2-ep2 server with only the two logging flags added, its radix cache
    # flushed before each point; D = the graph-padding plan's with-16 server, with and without TP 2
    from orchestrator.calibrate.twogpu import LAYOUTS, plan

    dp, tp2, tp1 = json.loads(LEASE4.read_text())
    (dp_twogpu,) = plan(["dpattn2-ep2"])
    assert dp["flags"] == [*dp_twogpu["flags"], "--gc-warning-threshold-secs", "0.05", "--log-requests"]
    assert dp["decode_batches"] == [128, 512] and dp["repeats"] == 2
    with16 = json.loads(PLAN.read_text())[0]["flags"]
    assert tp1["flags"] == with16 and tp2["flags"] == [*LAYOUTS["tp2"], *with16]
    assert all(v["flush_cache"] for v in (dp, tp2, tp1))
    rc = main(["single", "--model-path", str(R1S), "--name", "r1s6-lease4", "--out", str(tmp_path / "o"),
               "--budget-s", "450", "--plan-json", str(LEASE4), "--dry-run", "--flag=--trust-remote-code",
               "--flag=--triton-attention-split-tile-size", "--flag=256"])
    servers = _servers(capsys.readouterr().out)
    assert rc == 0 and list(servers) == ["dpattn2-ep2-logged", "tp2-graphs-with-16", "tp1-graphs-with-16"]
    assert all("radix cache flushed before each decode/context point" in line for line in servers.values())


def test_a_flushing_variant_posts_flush_cache_before_each_point(tmp_path) -> None:
    # a loopback HTTP server in SGLang's place (no GPU here): it records the order of the calls it gets
    import random
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from orchestrator.calibrate.server import SglangServer
    from orchestrator.calibrate.single import measure_decode_point

    calls: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            calls.append(self.path)
            busy = self.path == "/flush_cache" and calls.count("/flush_cache") == 2   # SGLang's "not idle" answer
            body = b"not idle" if busy else json.dumps({"meta_info": {"completion_tokens": 1}}).encode()
            self.send_response(400 if busy else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        srv = SglangServer("fake", "m", httpd.server_address[1], tmp_path / "server.log", [])
        (tmp_path / "server.log").write_text("")
        rows = [measure_decode_point(srv, random.Random(0), 1000, b, 8, flush=True) for b in (2, 3)]
    finally:
        httpd.shutdown()
    assert calls == ["/flush_cache", "/generate", "/generate", "/flush_cache", "/generate", "/generate", "/generate"]
    assert [r["cache_flushed"] for r in rows] == ["200", "400: b'not idle'"]
    assert "cache_flushed" not in _point_without_flush(tmp_path)


def _point_without_flush(tmp_path: Path) -> dict:
    """A point of a variant without flush_cache records no flush (and sends none): the server here is not even up."""
    import random

    from orchestrator.calibrate.server import SglangServer
    from orchestrator.calibrate.single import measure_decode_point

    srv = SglangServer("down", "m", 9, tmp_path / "down.log", [])
    (tmp_path / "down.log").write_text("")
    return measure_decode_point(srv, random.Random(0), 1000, 1, 8)
