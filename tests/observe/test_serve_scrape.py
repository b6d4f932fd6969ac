"""`pd-orchestrator serve` scraped by a real Prometheus, as a user watches the 2026 contest's shape in Grafana.

`monitor up` (Debian's `prometheus`, our generated scrape config: the run's file_sd JSON + Ray's own SD file) ->
`serve --detach` on the session's 2-node Ray cluster (simulated Qwen3 1P1D at time scale 0.05) -> closed-loop
streamed chats through the OpenAI gateway -> every panel of every dashboard that says it applies to serving
(dashboard tag `serve`) is evaluated against Prometheus's HTTP API for the service's run, as Grafana would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.cluster.ports import free_port
from orchestrator.config import dump_config, load_config
from orchestrator.observe.dashboards import dashboard_queries, expand_macros, load_dashboards
from tests.support import ChatLoad, Prom, qwen3_sim_config, wait_until

pytestmark = [
    pytest.mark.ray,
    pytest.mark.prometheus,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="the prometheus binary is not installed"),
]
ROOT = Path(__file__).resolve().parents[2]
SCRAPE_S = 0.25
RATE_WINDOW = "2s"  # stands in for Grafana's $__rate_interval: several scrapes at SCRAPE_S
NO_GPU_SERIES = ("ray_node_gpus_", "ray_node_gram_")  # Ray exports no GPU series on a machine without GPUs


def cli(env: dict, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def serving_dashboards() -> dict[str, dict]:
    return {name: d for name, d in load_dashboards().items() if "serve" in d.get("tags", [])}


def test_dashboards_say_whether_they_apply_to_serving():
    """Every dashboard is tagged `bench`, `serve` or both; the run overview is the bench job's (its phase, deadline
    and prompt panels have no data under `serve`), the serving dashboard is the gateway's."""
    tags = {name: set(d.get("tags", [])) & {"bench", "serve"} for name, d in load_dashboards().items()}
    assert all(tags.values()), tags
    assert tags["run-overview.json"] == {"bench"} and tags["serving.json"] == {"serve"}
    assert tags["engines.json"] == tags["cluster.json"] == {"bench", "serve"}


def test_prometheus_scrapes_a_running_serve_and_every_serving_panel_has_data(ray_cluster, tmp_path):
    port = free_port()
    base = tmp_path / "base.yaml"
    base.write_text(dump_config(qwen3_sim_config("pd")))
    cfg = load_config(base, [
        "name=watched", "engine.sim.startup_s=0", f"router.port={free_port()}", f"benchmark.result_dir={tmp_path}",
        f"metrics.file_sd_path={tmp_path / 'targets.json'}", f"metrics.prometheus_port={port}",
        f"metrics.scrape_interval_s={SCRAPE_S}", "metrics.exporter_port=0"])
    path = tmp_path / "serve.yaml"
    path.write_text(dump_config(cfg))
    ray_sd = wait_until(lambda: sorted(str(p) for p in Path(ray_cluster.root_dir).glob(
        "head*/prom_metrics_service_discovery.json") if json.loads(p.read_text() or "[]")), 60, 0.2,
        "Ray's prom_metrics_service_discovery.json")  # generous timeouts: polls, they cost nothing when met
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.gcs_address, "PD_ORCHESTRATOR_SERVE_DIR": str(tmp_path / "svc")}
    prom = Prom(f"http://127.0.0.1:{port}")
    up = cli(env, "monitor", "up", "--config", str(path), "--ray-sd-file", ray_sd[0], timeout=60)
    assert up.returncode == 0, up.stdout + up.stderr
    started = time.time()
    served = cli(env, "serve", "--config", str(path), "--detach", "--drain-s", "30")
    try:
        assert served.returncode == 0, served.stdout + served.stderr
        status = cli(env, "serve", "status", "--json", timeout=120)
        assert status.returncode == 0, status.stdout + status.stderr
        state = json.loads(status.stdout)
        run_id, gateway = state["run_id"], state["gateway"]

        def scraped() -> set[str]:
            up_series = prom.query(f'up{{job=~"pdorch.*", run_id="{run_id}"}} == 1')
            return {s["metric"].get("component") or s["metric"]["role"] for s in up_series}

        # the gateway's router replica and both engines, listed by `serve` itself; a scrape happened when up == 1
        wait_until(lambda: (t := scraped()) >= {"prefill", "decode"} and any(c.startswith("router-") for c in t),
                   120, 0.1, "Prometheus to scrape the gateway and both engines")
        completed = f'sum(pdorch_requests_completed_total{{run_id="{run_id}"}})'
        with ChatLoad(gateway, users=4, tokens=32) as load:
            wait_until(lambda: (prom.scalar(completed) or 0) >= 40 and not load.failed, 120, 0.2,
                       "40 completed chats in Prometheus")
        assert not load.failed, load.failed
        # every completed chat (all streamed, 32 tokens) was judged against the SLA: both counts from one scrape
        judged = f'sum(pdorch_sla_judged_requests_total{{run_id="{run_id}"}})'
        wait_until(lambda: prom.scalar(f"{judged} - {completed}") == 0, 60, 0.1,
                   "every completed chat judged against the SLA in Prometheus")
        wait_until(lambda: prom.query('ray_node_cpu_utilization{job="ray"}'), 120, 0.2, "Ray node metrics")
        wait_until(lambda: prom.query('ray_serve_deployment_replica_healthy{job="ray", application="pd-router"}'),
                   120, 0.2, "Ray Serve's replica health of the service's router")

        values = {"run_id": run_id, "worker": ".*", "node": ".*"}
        empty, checked = [], 0
        for q in dashboard_queries(serving_dashboards()):
            if any(s in q.expr for s in NO_GPU_SERIES):
                continue
            checked += 1
            if not prom.query_range(expand_macros(q.expr, values, RATE_WINDOW), started, time.time()):
                empty.append(f"{q.dashboard} {q.where}: {q.expr}")
        print(f"SERVE {run_id}: {checked} panel expressions of {sorted(serving_dashboards())} checked, "
              f"{len(empty)} empty")
        assert checked >= 30
        assert not empty, "serving panel expressions without data:\n" + "\n".join(empty)
        # the run variable of each serving dashboard offers this service's run
        for name, dash in serving_dashboards().items():
            for var in dash["templating"]["list"]:
                if var["name"] == "run_id":
                    selector = var["query"]["query"].removeprefix("label_values(").rsplit(",", 1)[0]
                    assert run_id in {s["metric"].get("run_id") for s in prom.query(selector)}, (name, selector)
    finally:
        down = cli(env, "serve", "down", "--name", "watched")
        cli(env, "monitor", "down", "--config", str(path), timeout=60)
    assert down.returncode == 0, down.stdout + down.stderr
