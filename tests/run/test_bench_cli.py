"""`pd-orchestrator bench` as a user reads it when a run cannot start: the whole reason first and last, no block
of zeros, no empty live frame, one line for a cluster address nothing answers at, and where the report is."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = str(ROOT / "configs/default.yaml")


def _bench(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    sets = [a for o in overrides for a in ("--set", o)]
    return subprocess.run([sys.executable, "-m", "orchestrator", "bench", "--config", DEFAULT, *sets,
                           "--set", "benchmark.num_prompts=5", "--result-dir", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: nothing listens there


def test_an_address_nothing_answers_at_is_one_line_with_the_fix_first_and_last(tmp_path) -> None:
    port = _closed_port()
    proc = _bench(tmp_path, f"cluster.address=127.0.0.1:{port}")
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    reason = (f"INVALID: placement failed: ClusterError: cluster.address=127.0.0.1:{port}: nothing answers at "
              f"127.0.0.1:{port} (Connection refused); start the head there (`ray start --head --port=<port>")
    assert lines[0].startswith(reason) and lines[-1] == lines[0]
    assert "RpcError" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    # no block of zeros and no empty live frame for a run that never started
    assert "Offline Throughput Benchmark Result" not in proc.stdout and "Successful requests" not in proc.stdout
    assert "pd-orchestrator bench\n" not in proc.stdout and "prompts done" not in proc.stdout
    assert "Prompts completed / failed / total:      0 / 5 / 5" in proc.stdout
    result = next(tmp_path.glob("*/result.json"))
    assert f"result: {result}" in lines and f"report: {result.parent / 'report.html'}" in lines
    assert (result.parent / "report.html").is_file()
    assert json.loads(result.read_text())["counts"] == {"num_prompts": 5, "completed": 0, "failed": 5}


def test_an_address_where_something_else_answers_is_one_line_too(tmp_path) -> None:
    """A host:port that takes the connection but is no Ray head (another service, or a proxy that takes every
    connection, as in the issue-22 trial): one line naming it, not a minute of failed GCS RPCs."""
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # answers 501 to all
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        proc = _bench(tmp_path, f"cluster.address=127.0.0.1:{port}")
    finally:
        server.shutdown()
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith(f"INVALID: placement failed: ClusterError: cluster.address=127.0.0.1:{port}: "
                               f"127.0.0.1:{port} answers, but not as a Ray head's GCS (gRPC "), lines[0]
    assert "start the head there" in lines[0] and lines[-1] == lines[0]
    assert "RpcError" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr


def test_a_layout_the_local_cluster_cannot_place_is_refused_at_preflight_before_any_cluster_starts(tmp_path) -> None:
    proc = _bench(tmp_path, "layout.prefill.0.count=2")
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("INVALID: preflight failed: ClusterError: layout.prefill.0: 2 server(s) x 8 GPUs do "
                               "not fit the nodes labelled role=prefill (1 node x 8 GPUs): 1 fit; set "
                               "layout.prefill.0.count=1")
    assert lines[-1] == lines[0] and "placement ..." not in proc.stderr
    # a run made with --set is named for it
    assert next(tmp_path.glob("*/result.json")).parent.name.startswith("default-set-")


def test_a_valid_run_prints_its_block_result_and_report_and_exits_zero(monkeypatch, tmp_path, capsys) -> None:
    """The printing of a VALID result (the whole run is the Ray job test's): no reason line, both paths."""
    from orchestrator.cli import main
    from orchestrator.observe.report import PhaseTime, RunVerdict, ThroughputSummary
    from orchestrator.records import RequestResult
    from orchestrator.run.bench_record import BenchResult

    records = [RequestResult(index=i, status="ok", prompt_len=10, output_len=4, completion_tokens=4, ttft_s=0.1,
                             e2e_s=0.5, sent_at=0.0, done_at=0.5) for i in range(2)]
    verdict = RunVerdict(engine="sim", layout="1PxTP8/1DxTP8", deadline_s=420, total_s=100.0,
                         phases=[PhaseTime("measured run", 90, 100)], num_prompts=2, completed=2, failed=0)
    result = BenchResult("r1", tmp_path / "r1" / "result.json", ThroughputSummary.from_results(records, 1.0),
                         verdict, records, report_path=tmp_path / "r1" / "report.html")
    monkeypatch.setattr("orchestrator.cli.bench.run_bench", lambda *a, **kw: result)
    assert main(["bench", "--config", DEFAULT]) == 0
    out = capsys.readouterr().out
    assert "INVALID" not in out and "Successful requests:                     2" in out
    assert out.splitlines()[-2:] == [f"result: {tmp_path / 'r1' / 'result.json'}",
                                     f"report: {tmp_path / 'r1' / 'report.html'}"]
