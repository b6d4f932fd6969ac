"""Dashboards, shipped Prometheus config and Grafana provisioning: valid for promtool, Grafana's schema, Grafana's API."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from orchestrator.observe.dashboards import (
    DASHBOARD_DIR,
    DATASOURCE_UID,
    FOLDER_UID,
    dashboard_queries,
    expand_macros,
    load_dashboards,
    write_provisioning,
)
from orchestrator.observe.monitor import render_prometheus_config

sys.path.insert(0, str(DASHBOARD_DIR))
import build as dashboard_build  # dashboards/build.py is a script, not a package module

REPO = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO / "build" / "grafana-schema"  # git-ignored; npm installs Grafana's types here
VARIABLES = {"run_id": "r1", "worker": ".*", "node": ".*"}

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")


def test_dashboard_json_on_disk_is_what_the_builder_makes():
    for name, text in dashboard_build.build_all().items():
        assert (DASHBOARD_DIR / name).read_text() == text, f"run `python dashboards/build.py`: {name} is stale"


def test_dashboards_cover_the_issue_panels_and_are_templated():
    dashboards = load_dashboards()
    assert set(dashboards) == {"run-overview.json", "serving.json", "engines.json", "cluster.json"}
    exprs = " ".join(q.expr for q in dashboard_queries(dashboards))
    for metric in (
        "pdorch_phase", "pdorch_deadline_seconds", "pdorch_elapsed_seconds", "pdorch_projected_finish_seconds",
        "pdorch_input_tokens_total", "pdorch_output_tokens_total", "pdorch_requests_in_flight",
        "pdorch_requests_failed_total", "pdorch_requests_rejected_total", "pdorch_itl_seconds",
        "pdorch_sla_good_requests_total", "pdorch_sla_attempted_requests_total", "pdorch_sla_good_output_tokens_total",
        "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
        "sglang:gen_throughput", "sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_decode_transfer_queue_reqs",
        "sglang:kv_transfer_latency_ms", "sglang:kv_transfer_speed_gb_s", "sglang:kv_transfer_total_mb",
        "ray_node_cpu_utilization", "ray_node_gpus_utilization",
    ):
        assert metric in exprs, f"no panel shows {metric}"
    for name in ("run-overview.json", "serving.json", "engines.json"):
        variables = {v["name"] for v in dashboards[name]["templating"]["list"]}
        assert "run_id" in variables
        for q in dashboard_queries({name: dashboards[name]}):
            if q.where.startswith("panel"):
                assert '$run_id' in q.expr, f"{name} {q.where} is not filtered by run id"
    assert all('$worker' in q.expr for q in dashboard_queries({"e": dashboards["engines.json"]})
               if q.where.startswith("panel"))


def test_the_serving_sla_panels_say_the_thresholds_are_the_configs_benchmark_slo():
    """The gateway judges by the run config's benchmark.slo (SloConfig.admits), so no panel states 3 s / 20 ms as if
    fixed: each SLA panel names the config field and gives the 2026 values as its defaults."""
    panels = {p["title"]: p["description"] for p in load_dashboards()["serving.json"]["panels"]}
    for title in ("Good request fraction", "Output tok/s: all and good"):
        assert "benchmark.slo.ttft_ms" in panels[title] and "benchmark.slo.itl_ms" in panels[title], title
        assert "defaults 3 s / 20 ms" in panels[title], title
    assert "benchmark.slo.itl_ms (default 20 ms)" in panels["ITL (inter-token latency)"]


def test_panel_ids_and_grid_positions_are_valid():
    for name, dash in load_dashboards().items():
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        for p in dash["panels"]:
            pos = p["gridPos"]
            assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, f"{name}: {p['title']} overflows the grid"


def test_expand_macros_rejects_unknown_variables():
    assert expand_macros('rate(x{run_id="$run_id"}[$__rate_interval])', VARIABLES, "30s") == 'rate(x{run_id="r1"}[30s])'
    with pytest.raises(ValueError, match=r"unexpanded variable.*\$nope"):
        expand_macros("x{a=\"$nope\"}", VARIABLES)


@needs_promtool
def test_shipped_prometheus_config_passes_promtool(tmp_path):
    result = subprocess.run(["promtool", "check", "config", str(DASHBOARD_DIR / "prometheus.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    rendered = tmp_path / "prometheus.yml"
    rendered.write_text(render_prometheus_config(tmp_path / "targets.json", 0.5, [str(tmp_path / "ray.json")]))
    result = subprocess.run(["promtool", "check", "config", str(rendered)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(rendered.read_text())
    assert config["global"]["scrape_interval"] == "500ms"
    files = {j["job_name"]: j["file_sd_configs"][0]["files"] for j in config["scrape_configs"]}
    assert files == {"pdorch": [str(tmp_path / "targets.json")], "ray": [str(tmp_path / "ray.json")]}


def _promtool_check_exprs(tmp_path: Path, exprs: list[str]) -> subprocess.CompletedProcess:
    """promtool parses PromQL only inside rule files, so each expression becomes a recording rule."""
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    return subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)


@needs_promtool
def test_every_dashboard_expression_parses(tmp_path):
    queries = dashboard_queries(load_dashboards())
    result = _promtool_check_exprs(tmp_path, [expand_macros(q.expr, VARIABLES) for q in queries])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(queries)} rules found" in result.stdout


@needs_promtool
def test_promtool_check_catches_a_broken_expression(tmp_path):
    result = _promtool_check_exprs(tmp_path, ["sum(rate(pdorch_input_tokens_total[1m])"])
    assert result.returncode != 0
    assert "parse error" in result.stdout + result.stderr


def _schema_toolchain() -> Path:
    """tsc + @grafana/schema (versions in dashboards/schema-check/package.json) in the git-ignored
    build/grafana-schema, which scripts/dev-setup.sh installs (with Debian's nodejs/npm when missing)."""
    tsc = SCHEMA_DIR / "node_modules" / ".bin" / "tsc"
    wanted = (DASHBOARD_DIR / "schema-check" / "package.json").read_text()
    installed = SCHEMA_DIR / "package.json"
    if not tsc.exists() or not installed.exists() or installed.read_text() != wanted:
        assert shutil.which("npm"), "npm is not installed: run scripts/dev-setup.sh (as root it installs nodejs/npm)"
        SCHEMA_DIR.mkdir(parents=True, exist_ok=True)
        installed.write_text(wanted)
        result = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(SCHEMA_DIR)],
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"npm install failed:\n{result.stderr[-2000:]}"
    return tsc


def _dashboard_as_typescript(dashboard: dict) -> str:
    """`export const dash = (<json>) satisfies Dashboard;` with enum-typed fields checked as enum values.

    TypeScript will not take a string literal for an enum type (thresholds.mode is ThresholdsMode), so
    those values go through enumValue<E>(v), whose parameter type is the union of E's member values.
    """
    def mark(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "thresholds" and isinstance(value, dict) and "mode" in value:
                    value["mode"] = f"__ENUM_ThresholdsMode__{value['mode']}"
                mark(value)
        elif isinstance(node, list):
            for value in node:
                mark(value)

    dashboard = json.loads(json.dumps(dashboard))
    mark(dashboard)
    body = re.sub(r'"__ENUM_(\w+)__(\w+)"', r'enumValue<\1>("\2")', json.dumps(dashboard, indent=1))
    return (
        "import type { Dashboard } from '@grafana/schema';\n"
        "import { ThresholdsMode } from '@grafana/schema';\n"
        "function enumValue<E extends string>(v: `${E}`): E { return v as unknown as E; }\n"
        f"export const dash = ({body}) satisfies Dashboard;\n"
    )


def _tsc(tsc: Path, files: dict[str, str]) -> subprocess.CompletedProcess:
    for name, text in files.items():
        (SCHEMA_DIR / name).write_text(text)
    (SCHEMA_DIR / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {"strict": True, "noEmit": True, "skipLibCheck": True, "module": "esnext",
                            "moduleResolution": "bundler", "target": "es2020"},
        "files": sorted(files),
    }))
    return subprocess.run([str(tsc), "-p", str(SCHEMA_DIR / "tsconfig.json")], capture_output=True, text=True,
                          timeout=120)


def test_dashboards_satisfy_grafanas_dashboard_schema():
    tsc = _schema_toolchain()
    files = {f"check_{n.removesuffix('.json').replace('-', '_')}.ts": _dashboard_as_typescript(d)
             for n, d in load_dashboards().items()}
    result = _tsc(tsc, files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_catches_wrong_types():
    tsc = _schema_toolchain()
    broken = load_dashboards()["run-overview.json"]
    broken["refresh"] = 5  # Grafana wants a string like "5s"
    broken["panels"][0]["gridPos"]["w"] = "wide"
    broken["panels"][1]["fieldConfig"]["defaults"]["thresholds"]["mode"] = "absolut"
    result = _tsc(tsc, {"check_broken.ts": _dashboard_as_typescript(broken)})
    assert result.returncode != 0
    out = result.stdout
    assert "Type 'number' is not assignable to type 'string'" in out
    assert "Type 'string' is not assignable to type 'number'" in out
    assert '"absolut"' in out


class _GrafanaStandIn(BaseHTTPRequestHandler):
    """Answers the Grafana HTTP API calls `dashboards push` makes, and records them."""

    calls: list[dict]
    state: dict

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.calls.append({"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"),
                           "body": body})
        if self.state.get("reject_token"):
            return self._reply(401, {"message": f"invalid API key {self.headers.get('Authorization')}"})
        route = (self.command, self.path)
        if route == ("GET", "/api/frontend/settings"):
            return self._reply(200, {"buildInfo": {"version": "11.6.0-standin"}})
        if route == ("GET", f"/api/datasources/uid/{DATASOURCE_UID}"):
            return self._reply(200, self.state["ds"]) if "ds" in self.state else self._reply(404, {"message": "nf"})
        if route in (("POST", "/api/datasources"), ("PUT", f"/api/datasources/uid/{DATASOURCE_UID}")):
            self.state["ds"] = body
            return self._reply(200, {"id": 1, "message": "ok"})
        if route == ("GET", f"/api/folders/{FOLDER_UID}"):
            return self._reply(200, self.state["folder"]) if "folder" in self.state else self._reply(404, {})
        if route == ("POST", "/api/folders"):
            self.state["folder"] = body
            return self._reply(200, {"uid": body["uid"], "title": body["title"]})
        if route == ("POST", "/api/dashboards/db"):
            self.state.setdefault("dashboards", {})[body["dashboard"]["uid"]] = body
            return self._reply(200, {"status": "success", "uid": body["dashboard"]["uid"]})
        return self._reply(404, {"message": f"stand-in has no route {route}"})

    do_GET = do_POST = do_PUT = _handle

    def log_message(self, *args) -> None:  # keep test output clean
        pass


@pytest.fixture
def grafana():
    calls: list[dict] = []
    state: dict = {}
    handler = type("Handler", (_GrafanaStandIn,), {"calls": calls, "state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", calls, state
    server.shutdown()
    server.server_close()


def _push(url: str, env_token: str | None, *extra: str) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k != "GRAFANA_TOKEN"}
    if env_token is not None:
        env["GRAFANA_TOKEN"] = env_token
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "dashboards", "push", "--grafana-url", url,
         "--prometheus-url", "http://prom.example:9090", *extra],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=60,
    )


def test_push_creates_then_updates_datasource_folder_and_dashboards(grafana):
    url, calls, state = grafana
    first = _push(url, "glsa_secret_token")
    assert first.returncode == 0, first.stderr
    assert all(c["auth"] == "Bearer glsa_secret_token" for c in calls)
    assert "glsa_secret_token" not in first.stdout + first.stderr
    assert state["ds"]["url"] == "http://prom.example:9090" and state["ds"]["type"] == "prometheus"
    assert state["folder"]["uid"] == FOLDER_UID
    shipped = load_dashboards()
    assert set(state["dashboards"]) == {d["uid"] for d in shipped.values()}
    for dash in shipped.values():
        posted = state["dashboards"][dash["uid"]]
        assert posted["folderUid"] == FOLDER_UID and posted["overwrite"] is True
        assert posted["dashboard"]["panels"] == dash["panels"]
    assert ("POST", "/api/datasources") in [(c["method"], c["path"]) for c in calls]

    calls.clear()
    second = _push(url, "glsa_secret_token")
    assert second.returncode == 0, second.stderr
    routes = [(c["method"], c["path"]) for c in calls]
    assert ("PUT", f"/api/datasources/uid/{DATASOURCE_UID}") in routes
    assert ("POST", "/api/datasources") not in routes and ("POST", "/api/folders") not in routes
    assert "datasource pdorch-prometheus updated" in second.stdout


def test_push_reads_the_token_from_a_file(grafana, tmp_path):
    url, calls, _ = grafana
    token_file = tmp_path / "token"
    token_file.write_text("from_file_token\n")
    result = _push(url, None, "--token-file", str(token_file))
    assert result.returncode == 0, result.stderr
    assert calls and all(c["auth"] == "Bearer from_file_token" for c in calls)


def test_push_without_credentials_refuses_and_calls_nothing(grafana):
    url, calls, _ = grafana
    result = _push(url, None)
    assert result.returncode == 1
    assert "GRAFANA_TOKEN" in result.stderr and "--token-file" in result.stderr
    assert calls == []


def test_push_error_never_shows_the_token(grafana):
    url, _, state = grafana
    state["reject_token"] = True
    result = _push(url, "glsa_leaky_token")
    assert result.returncode == 1
    assert "glsa_leaky_token" not in result.stdout + result.stderr
    assert "dashboards push:" in result.stderr


def test_provisioning_tree_points_grafana_at_the_dashboards(tmp_path):
    written = write_provisioning(tmp_path, "http://prom.example:9090")
    assert {p.name for p in written} >= {"run-overview.json", "serving.json", "engines.json", "cluster.json",
                                        "pd-orchestrator.yaml"}
    ds = yaml.safe_load((tmp_path / "provisioning/datasources/pd-orchestrator.yaml").read_text())
    assert ds["datasources"][0]["url"] == "http://prom.example:9090"
    providers = yaml.safe_load((tmp_path / "provisioning/dashboards/pd-orchestrator.yaml").read_text())
    dash_dir = Path(providers["providers"][0]["options"]["path"])
    assert sorted(p.name for p in dash_dir.glob("*.json")) == ["cluster.json", "engines.json", "run-overview.json",
                                                                 "serving.json"]
