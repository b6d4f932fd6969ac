"""`pd-orchestrator monitor up|down` (a local Prometheus) and `dashboards push|files` (Grafana)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.cli.args import add_config_args, config_from_args
from orchestrator.observe.dashboards import load_dashboards, push_dashboards, read_token, write_provisioning
from orchestrator.observe.monitor import (
    RAY_SD_FILE,
    local_cluster_ray_sd_files,
    monitor_paths,
    prometheus_down,
    prometheus_up,
)


def _redact(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text


def _cmd_monitor_up(args: argparse.Namespace) -> int:
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
    paths = monitor_paths(config_from_args(args))
    pid = prometheus_down(paths)
    print(f"prometheus pid {pid} stopped" if pid else f"no prometheus recorded in {paths.pid_file}")
    return 0


def _prometheus_url(args: argparse.Namespace) -> str:
    if args.prometheus_url:
        return args.prometheus_url
    if args.config:
        from orchestrator.cli.args import config_from_args

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
