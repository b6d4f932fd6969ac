"""The device scripts' engine scraper (scripts/device/scrape_lib.sh) against a real HTTP server on loopback that looks to
it like a running SGLang server (its command line names sglang.launch_server, --port, --disaggregation-mode): called
the way benchmarks/device_pd.sh and device_r1_full.sh call it, and through bench_lib.sh's start_scraper, which also
copies the local cluster's engine logs on each pass. No GPU and no SGLang: the scraper reads only the command line
and two HTTP endpoints."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.cluster.ports import free_port
from tests.support import wait_until

ROOT = Path(__file__).resolve().parents[2]
METRICS = 'sglang:num_running_reqs{model_name="stand-in"} 3.0\nsglang:num_queue_reqs{model_name="stand-in"} 0.0\n'
SERVER_INFO = {"disaggregation_mode": "decode", "max_total_num_tokens": 1234}

STAND_IN = """
import http.server, json, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
bodies = {"/metrics": (sys.argv[1].encode(), "text/plain"), "/server_info": (sys.argv[2].encode(), "application/json")}
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body, kind = bodies.get(self.path, (b"not found", "text/plain"))
        self.send_response(200 if self.path in bodies else 404)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def stand_in_server() -> Iterator[int]:
    """A loopback HTTP server whose argv reads like `python -m sglang.launch_server ... --port P` of a PD decode."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", STAND_IN, METRICS, json.dumps(SERVER_INFO), "sglang.launch_server",
                             "--port", str(port), "--disaggregation-mode", "decode"])
    try:
        wait_until(lambda: _answers(port), 30, 0.05, "the stand-in server answering /metrics")
        yield port
    finally:
        proc.kill()
        proc.wait()


def _answers(port: int) -> bool:
    return subprocess.run(["curl", "-s", "-f", "-m", "2", f"http://127.0.0.1:{port}/metrics"],
                          capture_output=True).returncode == 0


def _scrape_until(script: str, scrape: Path, wanted: list[str], env: dict | None = None) -> None:
    """Run `script` (bash, set -u as the device scripts are) in its own process group until a pass has written every
    file of `wanted` under `scrape`, then stop it as the scripts' stop_scraper does (the loop would run until killed)."""
    proc = subprocess.Popen(["bash", "-c", "set -u\n" + script, "bash", str(scrape)], cwd=ROOT, start_new_session=True,
                            env={**os.environ, **(env or {})})
    try:
        wait_until(lambda: all((scrape / name).is_file() and (scrape / name).stat().st_size for name in wanted), 30, 0.05, f"the scraper writing {wanted}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_scrape_engines_as_device_pd_and_r1_full_call_it_writes_each_servers_metrics_and_server_info(
        tmp_path, stand_in_server) -> None:
    port, scrape = stand_in_server, tmp_path / "scrape"
    # benchmarks/device_pd.sh: start_scraper() { scrape_engines "$1" & SCRAPER=$!; }, killed by stop_scraper
    _scrape_until('. scripts/device/scrape_lib.sh\nscrape_engines "$1" & SCRAPER=$!\nwait $SCRAPER', scrape,
                  [f"decode_{port}.prom", f"decode_{port}.server_info.json"])
    assert (scrape / f"decode_{port}.prom").read_text() == METRICS
    assert json.loads((scrape / f"decode_{port}.server_info.json").read_text()) == SERVER_INFO
    assert not list(scrape.glob("*.tmp"))  # a pass writes beside and renames: a reader never sees half a scrape


def test_bench_libs_scraper_also_copies_the_local_clusters_engine_logs(tmp_path, stand_in_server) -> None:
    port, scrape = stand_in_server, tmp_path / "scrape"
    # a local cluster's temp dir as bench leaves it while the run is up (bench_lib.sh's copy_cluster_engine_logs glob)
    cluster = Path(tempfile.mkdtemp(prefix="pdo-ray-scrapetest-", dir="/tmp"))
    logs = cluster / "node0" / "session_2026" / "logs" / "pd-engines" / "run-7"
    logs.mkdir(parents=True)
    (logs / "decode-0.log").write_text("Decode batch. #running-req: 3\n")
    try:
        env = {"PDO_DIR": str(tmp_path / "pdo"), "SITE_DIR": str(tmp_path / "site"), "OUT": str(tmp_path / "out")}
        _scrape_until('. scripts/device/bench_lib.sh\nstart_scraper "$1"\nwait $SCRAPER', scrape,
                      [f"decode_{port}.prom", "run-7/decode-0.log"], env)
    finally:
        shutil.rmtree(cluster)
    assert (scrape / "run-7" / "decode-0.log").read_text() == "Decode batch. #running-req: 3\n"
    assert (scrape / f"decode_{port}.prom").read_text() == METRICS
