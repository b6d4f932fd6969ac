"""A short simulated PD benchmark scraped by a real Prometheus: rates match the run, every panel has data.

sim prefill + sim decode (real processes, real HTTP) <- PDDispatcher with RouterMetrics <- bench loop with
BenchMetrics + LiveView; exporters + engines listed in a file_sd JSON; Debian's `prometheus` scrapes it
through `monitor.prometheus_up`. The test then asks Prometheus's HTTP API what a dashboard would.
Two Ray tests use the session cluster: the cluster dashboard against Ray's own SD file, and the user's
path — `monitor up`, then `pd-orchestrator bench` in a process of its own — after which every panel of
every dashboard tagged `bench` is evaluated for that run.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from orchestrator.cluster.ports import free_port
from orchestrator.config import dump_config
from orchestrator.observe.dashboards import dashboard_queries, expand_macros, load_dashboards
from orchestrator.observe.file_sd import TargetFile, engine_group, exporter_group
from orchestrator.observe.html_report import PLOTS, write_report
from orchestrator.observe.live import LiveView
from orchestrator.observe.metrics import BenchMetrics, RouterMetrics, start_exporter
from orchestrator.observe.monitor import MonitorPaths, local_cluster_ray_sd_files, prometheus_down, prometheus_up
from orchestrator.records import BenchRequest
from orchestrator.router.batch import run_batch
from orchestrator.router.dispatch.dispatcher import PDDispatcher
from orchestrator.router.dispatch.settings import DispatchSettings
from tests.support import Prom, SimServer, sim_config, start_servers, wait_until

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="the prometheus binary is not installed"),
]
os.environ.setdefault("UCX_NET_DEVICES", "lo")

RUN_ID = "e2e-run"
SCRAPE_S = 0.25
RATE_WINDOW = "2s"  # stands in for Grafana's $__rate_interval: several scrapes at SCRAPE_S
NUM_PROMPTS = 48
DECODE_ERROR_RATE = 0.1  # some failures, so the failure panels have data too


def sim_run_config():
    # time_scale 60: a ~6 s run, three RATE_WINDOWs of scrapes (the paced sim ran 48 prompts in 0.02 s at 0.05)
    return sim_config({"name": RUN_ID, "cluster.gpu": "H100-SXM", "model.quantization": "fp8",
                       "engine.sim.time_scale": 60.0, "engine.sim.kv_transfer": "http",
                       "engine.sim.faults": {"decode": {"error_rate": DECODE_ERROR_RATE, "seed": 7}},
                       "benchmark.deadline_s": 120, "benchmark.num_prompts": NUM_PROMPTS},
                      prefill=[{"tp": 8}], decode=[{"tp": 8}])


@dataclass
class ObservedRun:
    prom: Prom
    results: list
    run_start: float
    run_end: float
    job_start: float
    job_end: float
    bench: BenchMetrics
    live_log: str
    targets_path: Path


def synthetic_batch(n: int) -> list[BenchRequest]:
    rng = random.Random(2025)
    return [BenchRequest(index=i, input_ids=[rng.randrange(1000, 30000) for _ in range(rng.randint(64, 768))],
                         output_len=rng.randint(16, 96)) for i in range(n)]


async def drive(dispatcher: PDDispatcher, requests, view: LiveView, deadline_at: float) -> list:
    results = []
    async for result in run_batch(dispatcher, requests, max_in_flight=16, deadline_at=deadline_at):
        view.update(result)
        results.append(result)
    await dispatcher.close()
    return results


@pytest.fixture(scope="module")
def observed_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    cfg = sim_run_config()
    layout = cfg.layout.describe()
    job_start = time.time()
    bench = BenchMetrics(RUN_ID, layout, cfg.benchmark.deadline_s, started_at=job_start)
    router = RouterMetrics(RUN_ID, layout)
    exporters = [start_exporter("127.0.0.1", 0, bench.registry), start_exporter("127.0.0.1", 0, router.registry)]
    targets = TargetFile(tmp / "targets.json")
    targets.set("exporter/driver", exporter_group(RUN_ID, exporters[0].address, "driver"))
    targets.set("exporter/router-0", exporter_group(RUN_ID, exporters[1].address, "router-0"))
    paths = MonitorPaths(tmp / "monitor")
    prom_port = free_port()
    servers: list[SimServer] = []
    live_log = io.StringIO()
    try:
        _, prom_url = prometheus_up(paths, targets.path, prom_port, SCRAPE_S, [str(tmp / "no-ray-sd.json")])
        prom = Prom(prom_url)
        view = LiveView(cfg.benchmark.deadline_s, NUM_PROMPTS, 0, quiet=True, stream=live_log, log_interval_s=1,
                        started_at=job_start, metrics=bench)
        view.phase("placement")
        view.phase("engine_start")
        servers = start_servers(cfg, ["prefill", "decode"], tmp)
        for endpoint in (s.endpoint() for s in servers):
            targets.set("engine/" + endpoint.name, engine_group(RUN_ID, endpoint))
            router.add_worker(endpoint.role, endpoint.name)
        wait_until(lambda: len([t for t in prom.query("up") if t["value"][1] == "1"]) == 4, 30, 0.1,
                   "Prometheus to scrape both exporters and both engines")
        view.phase("warmup")
        requests = synthetic_batch(NUM_PROMPTS)
        view.total_output_tokens = sum(r.output_len for r in requests)
        dispatcher = PDDispatcher(DispatchSettings(max_attempts=1), mode="pd", metrics=router)
        dispatcher.set_workers([s.endpoint() for s in servers])
        view.phase("run")
        run_start = time.time()
        results = asyncio.run(drive(dispatcher, requests, view, run_start + 90))
        run_end = time.time()
        view.phase("report")
        view.phase("done")
        ok_out = sum(r.completion_tokens for r in results if r.status == "ok")
        # the run is over when Prometheus has scraped its final counters
        wait_until(lambda: prom.scalar(f'sum(pdorch_output_tokens_total{{run_id="{RUN_ID}"}})') == ok_out, 20, 0.1,
                   "the final output-token count in Prometheus")
        wait_until(lambda: prom.scalar(f'max(pdorch_phase{{run_id="{RUN_ID}", phase="done"}})') == 1, 20, 0.1,
                   "the done phase in Prometheus")
        yield ObservedRun(prom, results, run_start, run_end, job_start, time.time(), bench, live_log.getvalue(),
                          targets.path)
    finally:
        for s in servers:
            s.stop()
        prometheus_down(paths)
        for e in exporters:
            e.close()


def test_the_run_had_successes_and_injected_failures(observed_run):
    statuses = [r.status for r in observed_run.results]
    assert len(statuses) == NUM_PROMPTS
    assert statuses.count("ok") >= NUM_PROMPTS // 2
    assert statuses.count("failed") >= 1, "the decode error_rate fault should fail some requests"


def test_token_counters_equal_the_benchmarks_own_totals(observed_run):
    prom, ok = observed_run.prom, [r for r in observed_run.results if r.status == "ok"]
    sel = f'run_id="{RUN_ID}"'
    assert prom.scalar(f"sum(pdorch_input_tokens_total{{{sel}}})") == sum(r.prompt_len for r in ok)
    assert prom.scalar(f"sum(pdorch_output_tokens_total{{{sel}}})") == sum(r.completion_tokens for r in ok)
    assert prom.scalar(f"sum(pdorch_requests_completed_total{{{sel}}})") == len(ok)
    assert prom.scalar(f"sum(pdorch_requests_failed_total{{{sel}}})") == NUM_PROMPTS - len(ok)


def test_per_phase_token_rates_are_non_zero_and_add_up_to_the_totals(observed_run):
    run = observed_run
    prom, ok = run.prom, [r for r in run.results if r.status == "ok"]
    sel = f'run_id="{RUN_ID}"'
    for metric, total in (("pdorch_input_tokens_total", sum(r.prompt_len for r in ok)),
                          ("pdorch_output_tokens_total", sum(r.completion_tokens for r in ok))):
        series = prom.query_range(f"sum(rate({metric}{{{sel}}}[{RATE_WINDOW}]))", run.run_start, run.run_end + 2)
        peak = max(float(v) for _, v in series[0]["values"])
        assert peak > 0, f"{metric}: rate() never rose above 0 during the run"
        # the counters' growth over the run is the benchmark's total (within 5 %). Measured as last minus
        # first scraped value: increase() extrapolates to the window edges, which on a short run scraped
        # every second overshoots by a few percent on its own.
        window_s = int(run.job_end - run.run_start) + 2
        increase = prom.scalar(
            f"sum(max_over_time({metric}{{{sel}}}[{window_s}s])) - sum(min_over_time({metric}{{{sel}}}[{window_s}s]))",
            run.job_end,
        )
        assert increase == pytest.approx(total, rel=0.05), f"{metric}: Prometheus {increase} vs bench {total}"


def test_engine_metrics_agree_with_the_benchmark(observed_run):
    prom, ok = observed_run.prom, [r for r in observed_run.results if r.status == "ok"]
    generated = prom.scalar(f'sum(sglang:generation_tokens_total{{run_id="{RUN_ID}", role="decode"}})')
    assert generated == pytest.approx(sum(r.completion_tokens for r in ok), rel=0.05)
    assert prom.scalar(f'max(sglang:simulated{{run_id="{RUN_ID}"}})') == 1


def test_deadline_gauges_exist_and_say_the_run_made_it(observed_run):
    prom = observed_run.prom
    sel = f'run_id="{RUN_ID}"'
    assert prom.scalar(f"max(pdorch_deadline_seconds{{{sel}}})") == 120
    elapsed = prom.scalar(f"max(pdorch_elapsed_seconds{{{sel}}})")
    assert 0 < elapsed < 120
    projected = prom.scalar(f"max(pdorch_projected_finish_seconds{{{sel}}})")
    assert projected is not None and projected < 120
    phases = {s["metric"]["phase"]: float(s["value"][1]) for s in prom.query(f"pdorch_phase{{{sel}}}")}
    assert phases["done"] == 1 and sum(phases.values()) == 1


def bench_dashboards() -> dict[str, dict]:
    """The dashboards that say a `bench` run feeds them (tag `bench`); serve's are tests/observe/test_serve_scrape.py's."""
    return {name: d for name, d in load_dashboards().items() if "bench" in d.get("tags", [])}


def test_every_dashboard_expression_returns_data(observed_run):
    run = observed_run
    needs_ray = {"cluster.json"}  # Ray's node metrics: no Ray cluster in this test (see docs/observability.md)
    values = {"run_id": RUN_ID, "worker": ".*", "node": ".*"}
    empty = []
    checked = 0
    for q in dashboard_queries(bench_dashboards()):
        if q.dashboard in needs_ray:
            continue
        expr = expand_macros(q.expr, values, RATE_WINDOW)
        if not run.prom.query_range(expr, run.job_start, run.job_end):
            empty.append(f"{q.dashboard} {q.where}: {expr}")
        checked += 1
    assert checked >= 30
    assert not empty, "expressions without data:\n" + "\n".join(empty)


def test_live_view_logged_the_run_in_quiet_mode(observed_run):
    lines = observed_run.live_log.splitlines()
    assert any(" run " in line for line in lines)
    assert f"prompts {NUM_PROMPTS}/{NUM_PROMPTS}" in lines[-1]
    assert "\x1b[" not in observed_run.live_log


def test_html_report_of_the_simulated_run_has_every_plot(observed_run, tmp_path):
    result = {"run_id": RUN_ID, "deadline_s": 120, "simulated": True, "started_at": observed_run.job_start,
              "phases": observed_run.bench.timeline_dicts(),
              "results": [r.to_dict() for r in observed_run.results]}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(result))
    page = write_report(path).read_text()
    for name in PLOTS:
        assert f'id="plot-{name}"' in page
        assert (tmp_path / f"{name}.png").stat().st_size > 5000


def test_monitor_up_and_down_from_the_command_line(tmp_path):
    port = free_port()
    sets = ["--set", f"benchmark.result_dir={tmp_path}", "--set", f"metrics.prometheus_port={port}",
            "--set", f"metrics.file_sd_path={tmp_path / 'targets.json'}"]
    cli = [sys.executable, "-m", "orchestrator", "monitor"]
    repo = Path(__file__).resolve().parents[2]
    up = subprocess.run([*cli, "up", *sets], capture_output=True, text=True, cwd=repo, timeout=60)
    pid_file = tmp_path / "monitor" / "prometheus.pid"
    try:
        assert up.returncode == 0, up.stderr
        pid = int(pid_file.read_text().split()[0])
        assert httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=5).status_code == 200
        config = httpx.get(f"http://127.0.0.1:{port}/api/v1/status/config", timeout=5).json()["data"]["yaml"]
        assert str(tmp_path / "targets.json") in config
        again = subprocess.run([*cli, "up", *sets], capture_output=True, text=True, cwd=repo, timeout=60)
        assert again.returncode == 1 and f"already running (pid {pid})" in again.stderr
    finally:
        down = subprocess.run([*cli, "down", *sets], capture_output=True, text=True, cwd=repo, timeout=60)
    assert down.returncode == 0 and f"pid {pid} stopped" in down.stdout
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or "zombie" in _proc_state(pid), 15, 0.1, "prometheus to exit")
    assert not pid_file.exists()


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


@pytest.mark.ray
def test_cluster_dashboard_shows_ray_node_metrics_from_rays_sd_file(ray_cluster, make_sim_config, tmp_path):
    """The session's 2-node cluster: Prometheus follows Ray's SD file, the cluster panels get data."""
    cfg = make_sim_config()  # result_dir = tmp_path, where `monitor up` looks for the local cluster's state
    ray_cluster.save(Path(cfg.benchmark.result_dir) / "local-cluster.json")

    def written_sd_files() -> list[str]:
        return [f for f in local_cluster_ray_sd_files(cfg) if json.loads(Path(f).read_text() or "[]")]

    ray_sd = wait_until(written_sd_files, 60, 0.1, "Ray's prom_metrics_service_discovery.json")[0]
    paths = MonitorPaths(tmp_path / "monitor")
    start = time.time()
    try:
        _, url = prometheus_up(paths, tmp_path / "targets.json", free_port(), SCRAPE_S, [str(ray_sd)])
        prom = Prom(url)
        def node_instances() -> set[str]:
            return {s["metric"]["instance"] for s in prom.query('ray_node_cpu_utilization{job="ray"}')}

        wait_until(lambda: len(node_instances()) == 2, 60, 0.1, "node metrics of both Ray nodes in Prometheus")
        wait_until(lambda: all(len(s["values"]) > 2 for s in
                               prom.query_range('ray_node_mem_used{job="ray"}', start, time.time()) or [{"values": []}]),
                   30, 0.1, "a few scrapes of Ray node metrics")
        has_gpus = bool(prom.query("ray_node_gpus_utilization"))
        empty = []
        for q in dashboard_queries({"cluster.json": load_dashboards()["cluster.json"]}):
            if not has_gpus and ("ray_node_gpus_" in q.expr or "ray_node_gram_" in q.expr):
                continue  # no GPUs on this machine: those panels are empty by design
            if not prom.query_range(expand_macros(q.expr, {"node": ".*"}, RATE_WINDOW), start, time.time()):
                empty.append(f"{q.where}: {q.expr}")
        assert not empty, "cluster dashboard expressions without data:\n" + "\n".join(empty)
    finally:
        prometheus_down(paths)


@pytest.mark.ray
def test_monitor_up_sees_a_bench_run_and_every_panel_has_data(ray_driver, make_sim_config, tmp_path):
    """The user's path: `pd-orchestrator monitor up`, then `pd-orchestrator bench` (a process of its own,
    attached to the session cluster). The bench keeps metrics.file_sd_path current by itself (engines,
    router replica, driver), so Prometheus scrapes the run; every dashboard panel then returns a series
    for that run (counters start at 0, so a clean run's failure panels show 0, not nothing)."""
    port = free_port()
    targets_path = tmp_path / "targets.json"
    cfg = make_sim_config(overrides={
        "name": "monitored", "metrics.exporter_port": 0, "metrics.file_sd_path": str(targets_path),
        "metrics.prometheus_port": port, "metrics.scrape_interval_s": SCRAPE_S,
        # time_scale 10: the 24 cpu-fast prompts take seconds of wall time, several scrapes
        "engine.sim.time_scale": 10.0, "benchmark.num_prompts": 24,
    })
    config_path = tmp_path / "monitored.yaml"
    config_path.write_text(dump_config(cfg))
    ray_sd = sorted(str(p) for p in Path(ray_driver.root_dir).glob("head*/prom_metrics_service_discovery.json"))
    assert ray_sd, f"no Ray service-discovery file under {ray_driver.root_dir}"
    cli = [sys.executable, "-m", "orchestrator"]
    repo = Path(__file__).resolve().parents[2]
    up = subprocess.run([*cli, "monitor", "up", "--config", str(config_path), "--ray-sd-file", ray_sd[0]],
                        capture_output=True, text=True, cwd=repo, timeout=60)
    assert up.returncode == 0, up.stdout + up.stderr
    prom = Prom(f"http://127.0.0.1:{port}")
    try:
        started = time.time()
        env = {**os.environ, "RAY_ADDRESS": ray_driver.gcs_address}
        bench = subprocess.Popen([*cli, "bench", "--config", str(config_path), "--quiet"], cwd=repo, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def scraped_targets() -> set[str]:
            if bench.poll() is not None:
                raise AssertionError(f"bench ended before Prometheus scraped it:\n{bench.stdout.read()[-3000:]}")
            up_series = prom.query('up{job=~"pdorch.*", run_id=~"monitored-.*"} == 1')
            return {s["metric"].get("component") or s["metric"]["role"] for s in up_series}

        # the driver, the router replica and both engines, all listed by the bench itself
        found = wait_until(lambda: (t := scraped_targets()) >= {"driver", "prefill", "decode"}
                           and any(c.startswith("router-") for c in t) and t, 180, 0.1,
                           "Prometheus to scrape the bench's driver, router and engines")
        out, _ = bench.communicate(timeout=300)
        ended = time.time()
        assert bench.returncode == 0, out[-3000:]
        doc = json.loads(Path(out.split("result: ", 1)[1].split()[0]).read_text())
        run_id = doc["run_id"]
        assert json.loads(targets_path.read_text()) == [], "the run's targets stay listed after its teardown"

        names = {s["metric"]["__name__"] for s in prom.query_range(
            f'count by (__name__) ({{run_id="{run_id}"}})', started, ended, step=1)}
        assert {n for n in names if n.startswith("pdorch_")} >= {
            "pdorch_phase", "pdorch_output_tokens_total", "pdorch_requests_completed_total"}, names
        assert {n for n in names if n.startswith("sglang:")} >= {
            "sglang:num_running_reqs", "sglang:generation_tokens_total"}, names
        completed = prom.query_range(f'max(pdorch_bench_done_prompts{{run_id="{run_id}"}})', started, ended)
        assert completed and max(float(v) for _, v in completed[0]["values"]) == doc["counts"]["completed"]

        # the cluster dashboard's series come from Ray's node agents, scraped every 5 s (job "ray")
        wait_until(lambda: prom.query('ray_node_cpu_utilization{job="ray"}'), 60, 0.2, "Ray node metrics")
        values = {"run_id": run_id, "worker": ".*", "node": ".*"}
        empty, checked = [], 0
        for q in dashboard_queries(bench_dashboards()):
            if "ray_node_gpus_" in q.expr or "ray_node_gram_" in q.expr:
                continue  # no GPUs on this machine: Ray exports no GPU series (docs/observability.md)
            checked += 1
            if not prom.query_range(expand_macros(q.expr, values, RATE_WINDOW), started, time.time()):
                empty.append(f"{q.dashboard} {q.where}: {q.expr}")
        print(f"MONITOR {run_id}: targets {sorted(found)}; {checked} panel expressions checked, {len(empty)} empty")
        assert checked >= 40
        assert not empty, "panel expressions without data for the run:\n" + "\n".join(empty)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        subprocess.run([*cli, "monitor", "down", "--config", str(config_path)], capture_output=True, cwd=repo,
                       timeout=60)
