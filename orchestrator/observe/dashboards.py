"""Grafana dashboards: load dashboards/*.json, their PromQL, push through the HTTP API or write provisioning files."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

DASHBOARD_DIR = Path(__file__).resolve().parents[2] / "dashboards"


DATASOURCE_UID = "pdorch-prometheus"


FOLDER_UID = "pd-orchestrator"


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
