"""`pd-orchestrator monitor up|down` (a local Prometheus) and `dashboards push|files` (Grafana).

monitor up: run config -> rendered prometheus.yml (file_sd + Ray SD) -> system `prometheus` on loopback,
PID recorded under <result_dir>/monitor/; monitor down stops exactly that process.
dashboards push: dashboards/*.json + datasource -> Grafana HTTP API (grafana-client), token from env/file.
dashboards files: the same as a Grafana file-provisioning tree, for users who mount it.
"""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.observe.dashboards import DASHBOARD_DIR
from orchestrator.process import ManagedProcess, ProcessError

RAY_SD_FILE = "/tmp/ray/prom_metrics_service_discovery.json"


# ---------------------------------------------------------------------------------------------
# Prometheus


@dataclass
class MonitorPaths:
    """Where `monitor up` keeps its config, data and PID file."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "prometheus.yml"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def pid_file(self) -> Path:
        return self.root / "prometheus.pid"

    @property
    def log(self) -> Path:
        return self.root / "prometheus.log"


def render_prometheus_config(
    file_sd_path: str | Path, scrape_interval_s: float, ray_sd_files: list[str] | None = None
) -> str:
    """The shipped dashboards/prometheus.yml with this run's absolute file_sd path and interval."""
    config = yaml.safe_load((DASHBOARD_DIR / "prometheus.yml").read_text())
    interval = f"{max(int(scrape_interval_s * 1000), 100)}ms"
    config["global"]["scrape_interval"] = interval
    config["global"]["scrape_timeout"] = interval
    for job in config["scrape_configs"]:
        if job["job_name"] == "pdorch":
            job["file_sd_configs"][0]["files"] = [str(Path(file_sd_path).resolve())]
        elif job["job_name"] == "ray":
            job["file_sd_configs"][0]["files"] = list(ray_sd_files or [RAY_SD_FILE])
    return yaml.safe_dump(config, sort_keys=False)


def _is_our_prometheus(pid: int, config_path: Path) -> bool:
    """True if `pid` is a prometheus started with `config_path` (guards against a reused PID)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(argv) and Path(argv[0].decode()).name == "prometheus" and any(
        a.decode().endswith(str(config_path)) for a in argv
    )


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=1) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def prometheus_up(
    paths: MonitorPaths,
    file_sd_path: str | Path,
    port: int,
    scrape_interval_s: float = 1.0,
    ray_sd_files: list[str] | None = None,
    host: str = "127.0.0.1",
    binary: str = "prometheus",
    ready_timeout_s: float = 30,
) -> tuple[int, str]:
    """Start Prometheus with a rendered config; returns (pid, url). Refuses if ours already runs."""
    exe = shutil.which(binary)
    if exe is None:
        raise RuntimeError(f"'{binary}' not found on PATH; install it (Debian: apt-get install prometheus)")
    if paths.pid_file.exists():
        pid = int(paths.pid_file.read_text().split()[0])
        if _is_our_prometheus(pid, paths.config):
            raise RuntimeError(f"prometheus already running (pid {pid}); run `pd-orchestrator monitor down` first")
        paths.pid_file.unlink()
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.config.write_text(render_prometheus_config(file_sd_path, scrape_interval_s, ray_sd_files))
    url = f"http://{host}:{port}"
    proc = ManagedProcess(
        [exe, f"--config.file={paths.config}", f"--storage.tsdb.path={paths.data}",
         f"--web.listen-address={host}:{port}", "--web.enable-lifecycle"],
        paths.log, what="prometheus",
    )
    pid = proc.start()
    paths.pid_file.write_text(f"{pid} {url}\n")
    try:
        proc.wait_ready(lambda: _ready(url), ready_timeout_s, poll_s=0.1, where=url)
    except ProcessError:
        prometheus_down(paths)
        raise
    return pid, url


def prometheus_down(paths: MonitorPaths, timeout_s: float = 15) -> int | None:
    """Stop the Prometheus `prometheus_up` started (by its recorded PID); returns that PID or None."""
    if not paths.pid_file.exists():
        return None
    pid = int(paths.pid_file.read_text().split()[0])
    if _is_our_prometheus(pid, paths.config):  # a reused pid is someone else's process: leave it
        ManagedProcess.attach(pid, paths.log, what="prometheus").stop(grace_s=timeout_s)
    paths.pid_file.unlink(missing_ok=True)
    return pid


def local_cluster_ray_sd_files(cfg) -> list[str]:
    """Ray's SD file(s) of the embedded local cluster, if one is running (its head writes them)."""
    from orchestrator.cluster.local import DEFAULT_STATE_PATH, LocalClusterState

    state = LocalClusterState.load(Path(cfg.benchmark.result_dir) / DEFAULT_STATE_PATH.name)
    if state is None or not state.root_dir:
        return []
    return sorted(str(p) for p in Path(state.root_dir).glob("head*/prom_metrics_service_discovery.json"))


def monitor_paths(cfg) -> MonitorPaths:
    return MonitorPaths(Path(cfg.benchmark.result_dir) / "monitor")


# ---------------------------------------------------------------------------------------------
# Grafana


# ---------------------------------------------------------------------------------------------
# CLI


