"""`pd-orchestrator monitor up|down` (a local Prometheus) and `dashboards push|files` (Grafana).

monitor up: run config -> rendered prometheus.yml (file_sd + Ray SD) -> system `prometheus` on loopback,
PID recorded under <result_dir>/monitor/; monitor down stops exactly that process.
dashboards push: dashboards/*.json + datasource -> Grafana HTTP API (grafana-client), token from env/file.
dashboards files: the same as a Grafana file-provisioning tree, for users who mount it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

DASHBOARD_DIR = Path(__file__).resolve().parents[1] / "dashboards"
DATASOURCE_UID = "pdorch-prometheus"
FOLDER_UID = "pd-orchestrator"
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


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with code {proc.returncode} during start-up")
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)  # poll interval of a readiness check, not a synchronisation sleep
    raise RuntimeError(f"prometheus not ready at {url} after {timeout_s:.0f} s")


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
    with open(paths.log, "ab") as log_file:
        proc = subprocess.Popen(
            [exe, f"--config.file={paths.config}", f"--storage.tsdb.path={paths.data}",
             f"--web.listen-address={host}:{port}", "--web.enable-lifecycle"],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
    paths.pid_file.write_text(f"{proc.pid} {url}\n")
    try:
        _wait_ready(url, proc, ready_timeout_s)
    except RuntimeError as exc:
        prometheus_down(paths)
        raise RuntimeError(f"{exc}; see {paths.log}") from None
    return proc.pid, url


def prometheus_down(paths: MonitorPaths, timeout_s: float = 15) -> int | None:
    """Stop the Prometheus `prometheus_up` started (by its recorded PID); returns that PID or None."""
    if not paths.pid_file.exists():
        return None
    pid = int(paths.pid_file.read_text().split()[0])
    if _is_our_prometheus(pid, paths.config):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _is_our_prometheus(pid, paths.config) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        if _is_our_prometheus(pid, paths.config):
            os.kill(pid, signal.SIGKILL)
        _reap(pid)
    paths.pid_file.unlink(missing_ok=True)
    return pid


def _reap(pid: int) -> None:
    """Collect the exit status if we are the parent (same process as `up`), so no zombie lingers."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def local_cluster_ray_sd_files(cfg) -> list[str]:
    """Ray's SD file(s) of the embedded local cluster, if one is running (its head writes them)."""
    from orchestrator.cluster import DEFAULT_STATE_PATH, LocalClusterState

    state = LocalClusterState.load(Path(cfg.benchmark.result_dir) / DEFAULT_STATE_PATH.name)
    if state is None or not state.root_dir:
        return []
    return sorted(str(p) for p in Path(state.root_dir).glob("head*/prom_metrics_service_discovery.json"))


def monitor_paths(cfg) -> MonitorPaths:
    return MonitorPaths(Path(cfg.benchmark.result_dir) / "monitor")


# ---------------------------------------------------------------------------------------------
# Grafana


def load_dashboards(directory: Path = DASHBOARD_DIR) -> dict[str, dict]:
    """file name -> dashboard JSON of every dashboards/*.json."""
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


@dataclass(frozen=True)
class PanelQuery:
    """One PromQL expression of a dashboard: a panel target, or the selector of a variable query."""

    dashboard: str
    where: str  # panel title / "variable <name>"
    expr: str


def dashboard_queries(dashboards: dict[str, dict]) -> list[PanelQuery]:
    """Every PromQL expression in the dashboards (label_values(...) variables give their selector)."""
    out = []
    for name, dash in dashboards.items():
        for panel in dash.get("panels", []):
            for target in panel.get("targets", []):
                out.append(PanelQuery(name, f"panel {panel['title']!r} {target['refId']}", target["expr"]))
        for var in dash.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", query.strip())
            if not match:
                raise ValueError(f"{name}: variable {var['name']}: only label_values(selector, label) is supported")
            out.append(PanelQuery(name, f"variable {var['name']}", match.group(1)))
    return out


def expand_macros(expr: str, values: dict[str, str], rate_interval: str = "1m") -> str:
    """Replace Grafana's $__rate_interval/$__interval/$__range and $var / ${var} as Grafana would."""
    for macro, value in (("$__rate_interval", rate_interval), ("$__interval", rate_interval),
                         ("$__range", rate_interval)):
        expr = expr.replace(macro, value)
    expr = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2), m.group(0)), expr)
    if "$" in expr:
        raise ValueError(f"unexpanded variable left in {expr!r}; known: {sorted(values)}")
    return expr


def datasource_body(prometheus_url: str) -> dict:
    return {
        "name": "pd-orchestrator Prometheus",
        "uid": DATASOURCE_UID,
        "type": "prometheus",
        "access": "proxy",
        "url": prometheus_url,
        "jsonData": {"timeInterval": "1s"},
    }


def read_token(token_file: str | None, token_env: str) -> str:
    """The Grafana service-account token from a file or an environment variable; never a default."""
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise RuntimeError(f"--token-file {token_file}: cannot read ({exc.strerror})") from None
        if not token:
            raise RuntimeError(f"--token-file {token_file} is empty; put the Grafana API token in it")
        return token
    token = os.environ.get(token_env, "").strip()
    if not token:
        raise RuntimeError(
            f"no Grafana token: set ${token_env} (or --token-env NAME) or pass --token-file FILE; "
            "create one under Grafana > Administration > Service accounts"
        )
    return token


def push_dashboards(grafana_url: str, token: str, prometheus_url: str, dashboards: dict[str, dict]) -> list[str]:
    """Create/update the datasource, the folder and every dashboard; returns what was done, one line each."""
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaClientError

    if not grafana_url.startswith(("http://", "https://")):
        raise RuntimeError(f"--grafana-url {grafana_url!r} must start with http:// or https://")
    api = GrafanaApi.from_url(grafana_url, credential=token)
    done: list[str] = []
    build = api.health.check() or {}
    done.append(f"grafana {build.get('version', '?')} at {grafana_url}")

    body = datasource_body(prometheus_url)
    try:
        api.datasource.get_datasource_by_uid(DATASOURCE_UID)
        api.datasource.update_datasource_by_uid(DATASOURCE_UID, body)
        done.append(f"datasource {DATASOURCE_UID} updated -> {prometheus_url}")
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise
        api.datasource.create_datasource(body)
        done.append(f"datasource {DATASOURCE_UID} created -> {prometheus_url}")

    try:
        api.folder.get_folder(FOLDER_UID)
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise
        api.folder.create_folder("pd-orchestrator", uid=FOLDER_UID)
        done.append(f"folder {FOLDER_UID} created")

    for name, dashboard in dashboards.items():
        api.dashboard.update_dashboard(
            {"dashboard": {**dashboard, "id": None}, "folderUid": FOLDER_UID, "overwrite": True,
             "message": "pd-orchestrator dashboards push"}
        )
        done.append(f"dashboard {dashboard['uid']} ({name}) pushed")
    return done


def write_provisioning(out_dir: Path, prometheus_url: str) -> list[Path]:
    """A Grafana file-provisioning tree: provisioning/{datasources,dashboards}/*.yaml + dashboards/*.json."""
    dash_dir = out_dir / "dashboards"
    dash_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, dashboard in load_dashboards().items():
        (dash_dir / name).write_text(json.dumps(dashboard, indent=2) + "\n")
        written.append(dash_dir / name)
    ds = yaml.safe_load((DASHBOARD_DIR / "provisioning/datasources/pd-orchestrator.yaml").read_text())
    ds["datasources"][0]["url"] = prometheus_url
    providers = yaml.safe_load((DASHBOARD_DIR / "provisioning/dashboards/pd-orchestrator.yaml").read_text())
    providers["providers"][0]["options"]["path"] = str(dash_dir.resolve())
    for sub, data in (("datasources", ds), ("dashboards", providers)):
        path = out_dir / "provisioning" / sub / "pd-orchestrator.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        written.append(path)
    return written


# ---------------------------------------------------------------------------------------------
# CLI


def _redact(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text


def _cmd_monitor_up(args: argparse.Namespace) -> int:
    from orchestrator.cli import config_from_args

    cfg = config_from_args(args)
    paths = monitor_paths(cfg)
    ray_sd = args.ray_sd_file or [RAY_SD_FILE, *local_cluster_ray_sd_files(cfg)]
    try:
        pid, url = prometheus_up(
            paths, cfg.metrics.file_sd_path, cfg.metrics.prometheus_port, cfg.metrics.scrape_interval_s, ray_sd
        )
    except RuntimeError as exc:
        print(f"monitor up: {exc}", file=sys.stderr)
        return 1
    print(f"prometheus pid {pid} at {url} (config {paths.config}, targets {cfg.metrics.file_sd_path})")
    print(f"ray node metrics from: {', '.join(ray_sd)}")
    return 0


def _cmd_monitor_down(args: argparse.Namespace) -> int:
    from orchestrator.cli import config_from_args

    paths = monitor_paths(config_from_args(args))
    pid = prometheus_down(paths)
    print(f"prometheus pid {pid} stopped" if pid else f"no prometheus recorded in {paths.pid_file}")
    return 0


def _prometheus_url(args: argparse.Namespace) -> str:
    if args.prometheus_url:
        return args.prometheus_url
    if args.config:
        from orchestrator.cli import config_from_args

        cfg = config_from_args(args)
        return cfg.metrics.prometheus_url or f"http://127.0.0.1:{cfg.metrics.prometheus_port}"
    return "http://127.0.0.1:9090"


def _cmd_dashboards_push(args: argparse.Namespace) -> int:
    token = ""
    try:
        token = read_token(args.token_file, args.token_env)
        lines = push_dashboards(args.grafana_url, token, _prometheus_url(args), load_dashboards())
    except Exception as exc:  # report any failure in one line, with the token never shown
        print(f"dashboards push: {_redact(str(exc), token)}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    return 0


def _cmd_dashboards_files(args: argparse.Namespace) -> int:
    for path in write_provisioning(Path(args.out), _prometheus_url(args)):
        print(path)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from orchestrator.cli import add_config_args

    mon = sub.add_parser("monitor", help="start/stop a local Prometheus that scrapes the run")
    msub = mon.add_subparsers(dest="monitor_cmd", required=True)
    up = msub.add_parser("up", help="start prometheus on loopback (metrics.prometheus_port)")
    add_config_args(up, required=False)
    up.set_defaults(config="configs/default.yaml")
    up.add_argument("--ray-sd-file", action="append", default=[],
                    help=f"Ray's service-discovery JSON (default {RAY_SD_FILE} and the running local "
                         "cluster's; repeatable)")
    up.set_defaults(func=_cmd_monitor_up)
    down = msub.add_parser("down", help="stop the prometheus `monitor up` started")
    add_config_args(down, required=False)
    down.set_defaults(config="configs/default.yaml", func=_cmd_monitor_down)

    dash = sub.add_parser("dashboards", help="provision Grafana dashboards")
    dsub = dash.add_subparsers(dest="dashboards_cmd", required=True)
    push = dsub.add_parser("push", help="create/update datasource + dashboards through Grafana's HTTP API")
    push.add_argument("--grafana-url", required=True, help="e.g. http://grafana.example:3000")
    push.add_argument("--token-file", help="file holding a Grafana service-account token")
    push.add_argument("--token-env", default="GRAFANA_TOKEN", help="env var holding the token (default GRAFANA_TOKEN)")
    push.add_argument("--prometheus-url", help="URL Grafana reaches Prometheus at (default from config)")
    add_config_args(push, required=False)
    push.set_defaults(func=_cmd_dashboards_push)
    files = dsub.add_parser("files", help="write a Grafana file-provisioning tree")
    files.add_argument("--out", required=True, help="output folder")
    files.add_argument("--prometheus-url", help="URL Grafana reaches Prometheus at (default from config)")
    add_config_args(files, required=False)
    files.set_defaults(func=_cmd_dashboards_files)
