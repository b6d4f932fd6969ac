"""Grafana dashboards as code: `python dashboards/build.py` rewrites dashboards/*.json from this file.

Four dashboards, all on one Prometheus datasource variable:
run overview (the `bench` job: phase, deadline, progress, plus the router's request panels) | serving (the `serve`
gateway: the same request panels, ITL and the 2026 goodput SLA) | engines (SGLang's own `sglang:` metrics per worker) |
cluster (Ray nodes). Each dashboard's tags say which command feeds it (`bench`, `serve`): a panel is only on a
dashboard whose every tagged command exports its series (tests/observe/test_serve_scrape.py and
test_prometheus_e2e.py evaluate every panel against a real Prometheus for each).
tests/test_dashboards.py checks the JSON on disk equals what this builds, so edit here, then rebuild.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
RUN = 'run_id="$run_id"'
RUN_WORKER = 'run_id="$run_id", worker=~"$worker"'


@dataclass
class Panel:
    """One panel: title, kind (timeseries | stat | gauge | bargauge), PromQL targets as (legend, expr)."""

    title: str
    kind: str
    targets: list[tuple[str, str]]
    unit: str = "short"
    w: int = 12
    h: int = 8
    description: str = ""
    thresholds: list[tuple[str, float | None]] = field(default_factory=list)


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict:
    targets = [
        {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend, "range": True}
        for i, (legend, expr) in enumerate(panel.targets)
    ]
    steps = [{"color": c, "value": v} for c, v in (panel.thresholds or [("green", None)])]
    defaults: dict = {"unit": panel.unit, "thresholds": {"mode": "absolute", "steps": steps}}
    options: dict
    if panel.kind == "timeseries":
        options = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                   "tooltip": {"mode": "multi", "sort": "none"}}
    else:
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "orientation": "auto"}
        if panel.kind == "stat":
            options |= {"colorMode": "value", "graphMode": "area", "justifyMode": "auto", "textMode": "auto"}
    return {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DS,
        "gridPos": {"h": panel.h, "w": panel.w, "x": x, "y": y},
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
    }


def _layout(panels: list[Panel]) -> list[dict]:
    """Place panels left to right on a 24-column grid, wrapping rows."""
    out, x, y, row_h = [], 0, 0, 0
    for pid, panel in enumerate(panels, start=1):
        if x + panel.w > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(_panel_json(panel, pid, x, y))
        x += panel.w
        row_h = max(row_h, panel.h)
    return out


def _datasource_var() -> dict:
    return {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
            "hide": 0, "refresh": 1}


def _query_var(name: str, label: str, query: str, multi: bool) -> dict:
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "query": {"query": query, "refId": f"var-{name}"},
        "refresh": 2, "sort": 1, "hide": 0, "multi": multi, "includeAll": multi,
    }


def _dashboard(uid: str, title: str, description: str, panels: list[Panel], variables: list[dict],
               fed_by: tuple[str, ...]) -> dict:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["pd-orchestrator", *fed_by],
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-15m", "to": "now"},
        "refresh": "5s",
        "schemaVersion": 39,
        "version": 1,
        "links": [],
        "annotations": {"list": []},
        "templating": {"list": [_datasource_var(), *variables]},
        "panels": _layout(panels),
    }


def _quantiles(metric: str, selector: str, by: str = "") -> list[tuple[str, str]]:
    group = f"le{', ' + by if by else ''}"
    prefix = f"{{{{{by}}}}} " if by else ""
    return [
        (f"{prefix}p{int(q * 100)}",
         f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{selector}}}[$__rate_interval])))")
        for q in (0.5, 0.9, 0.99)
    ]


def _request_panels() -> list[Panel]:
    """The router's per-request panels: fed by every request it routes, from `bench`'s batch or the HTTP gateway."""
    rate = "[$__rate_interval]"
    return [
        Panel("Token throughput per phase", "timeseries",
              [("prefill (input) tok/s", f"sum(rate(pdorch_input_tokens_total{{{RUN}}}{rate}))"),
               ("decode (output) tok/s", f"sum(rate(pdorch_output_tokens_total{{{RUN}}}{rate}))"),
               ("total tok/s", f"sum(rate(pdorch_input_tokens_total{{{RUN}}}{rate})) + "
                               f"sum(rate(pdorch_output_tokens_total{{{RUN}}}{rate}))")],
              unit="short", w=12, description="Tokens of completed requests, counted on the worker that did them."),
        Panel("Requests per state", "timeseries",
              [("{{state}}", f"sum by (state) (pdorch_requests_in_flight{{{RUN}}})")], w=12),
        Panel("Decode tok/s per worker", "timeseries",
              [("{{worker}}", f"sum by (worker) (rate(pdorch_output_tokens_total{{{RUN}}}{rate}))")], w=8),
        Panel("Prefill tok/s per worker", "timeseries",
              [("{{worker}}", f"sum by (worker) (rate(pdorch_input_tokens_total{{{RUN}}}{rate}))")], w=8),
        Panel("Outstanding requests per worker", "timeseries",
              [("{{worker}}", f"sum by (role, worker) (pdorch_worker_outstanding_requests{{{RUN}}})")], w=8),
        Panel("TTFT", "timeseries", _quantiles("pdorch_ttft_seconds", RUN), unit="s", w=8),
        Panel("End-to-end latency", "timeseries", _quantiles("pdorch_e2e_seconds", RUN), unit="s", w=8),
        Panel("KV wait (prefill + transfer)", "timeseries", _quantiles("pdorch_kv_wait_seconds", RUN),
              unit="s", w=8),
        Panel("Completed / failed", "stat",
              [("completed", f"sum(pdorch_requests_completed_total{{{RUN}}})"),
               ("failed", f"sum(pdorch_requests_failed_total{{{RUN}}}) or vector(0)")],
              w=12, h=5, description="Failures by reason are in the panel to the right."),
        Panel("Failures by reason", "timeseries",
              [("{{reason}}", f"sum by (reason) (increase(pdorch_requests_failed_total{{{RUN}}}{rate}))")],
              w=12, h=5),
    ]


def run_overview() -> dict:
    """The bench job: phase, deadline, projection, prompts done; then the router's request panels."""
    panels = [
        Panel("Phase", "stat", [("{{phase}}", f"max by (phase) (pdorch_phase{{{RUN}}}) == 1")], w=4, h=5,
              description="The phase the benchmark job is in."),
        Panel("Elapsed vs deadline", "gauge",
              [("elapsed", f"max(pdorch_elapsed_seconds{{{RUN}}}) / max(pdorch_deadline_seconds{{{RUN}}})")],
              unit="percentunit", w=5, h=5, thresholds=[("green", None), ("orange", 0.8), ("red", 1.0)],
              description="Share of the wall budget used, all phases included."),
        Panel("Projected finish", "stat",
              [("projected", f"max(pdorch_projected_finish_seconds{{{RUN}}})"),
               ("deadline", f"max(pdorch_deadline_seconds{{{RUN}}})")],
              unit="s", w=5, h=5, description="Elapsed + remaining output tokens at the current rate."),
        Panel("Slack at projected finish", "stat",
              [("slack", f"max(pdorch_deadline_seconds{{{RUN}}}) - max(pdorch_projected_finish_seconds{{{RUN}}})")],
              unit="s", w=5, h=5, thresholds=[("red", None), ("green", 0)],
              description="Positive: on track. Negative: will miss the deadline by that much."),
        Panel("Prompts done", "stat",
              [("done", f"max(pdorch_bench_done_prompts{{{RUN}}}) / max(pdorch_bench_planned_prompts{{{RUN}}})")],
              unit="percentunit", w=5, h=5),
        *_request_panels(),
    ]
    return _dashboard(
        "pdorch-run", "PD run overview", "One `bench` run of pd-orchestrator against its deadline (the phase, "
        "deadline and prompt panels come from the bench driver: under `serve`, open the serving dashboard).", panels,
        [_query_var("run_id", "Run", "label_values(pdorch_deadline_seconds, run_id)", multi=False)],
        fed_by=("bench",),
    )


def serving() -> dict:
    """The `serve` gateway: request rate and outcomes, the 2026 goodput SLA, then the router's request panels."""
    rate = "[$__rate_interval]"
    sla = ("TTFT <= benchmark.slo.ttft_ms and ITL <= benchmark.slo.itl_ms of the run's config (defaults 3 s / 20 ms, "
           "the 2026 contest's AIPerf goodput SLA; pdorch_sla_good_requests' help text names the thresholds in force), "
           "judged per completed request as AIPerf judges it (one not streamed is never good)")
    panels = [
        Panel("Requests per second", "timeseries",
              [("completed", f"sum(rate(pdorch_requests_completed_total{{{RUN}}}{rate}))"),
               ("failed", f"sum(rate(pdorch_requests_failed_total{{{RUN}}}{rate}))"),
               ("rejected (503)", f"sum(rate(pdorch_requests_rejected_total{{{RUN}}}{rate}))")], w=8,
              description="Rejected: refused at the gateway before routing (queue full, or draining on stop)."),
        Panel("Good request fraction", "timeseries",
              [("good / attempted", f"sum(rate(pdorch_sla_good_requests_total{{{RUN}}}{rate})) / "
                                    f"sum(rate(pdorch_sla_attempted_requests_total{{{RUN}}}{rate}))")],
              unit="percentunit", w=8, thresholds=[("red", None), ("green", 0.9)],
              description=f"{sla}. Out of every request AIPerf would count (its good_request_fraction): completed, "
                          "failed and rejected (503) ones, not those whose client left. The green line is 0.90, "
                          "benchmark.slo.min_good_fraction's default: the contest counts a point only at >= 0.90."),
        Panel("Output tok/s: all and good", "timeseries",
              [("all", f"sum(rate(pdorch_output_tokens_total{{{RUN}}}{rate}))"),
               ("good (the score)", f"sum(rate(pdorch_sla_good_output_tokens_total{{{RUN}}}{rate}))")], w=8,
              description=f"Good: output tokens of the requests within the SLA ({sla})."),
        Panel("ITL (inter-token latency)", "timeseries", _quantiles("pdorch_itl_seconds", RUN), unit="s", w=12,
              description="Per streamed request: (e2e - TTFT) / (output tokens - 1), AIPerf's definition; "
                          "the SLA line is benchmark.slo.itl_ms (default 20 ms)."),
        Panel("Rejections by reason", "timeseries",
              [("{{reason}}", f"sum by (reason) (increase(pdorch_requests_rejected_total{{{RUN}}}{rate}))")],
              w=12, description="queue_full: router.max_in_flight_requests reached; stopping: the service drains."),
        *_request_panels(),
    ]
    return _dashboard(
        "pdorch-serve", "PD serving (gateway)", "A `serve` service's OpenAI gateway: every request routed, its "
        "latencies and the 2026 goodput SLA. Wall-clock seconds (a simulated engine's time_scale is not undone).",
        panels,
        [_query_var("run_id", "Run", "label_values(pdorch_requests_completed_total, run_id)", multi=False)],
        fed_by=("serve",),
    )


def engines() -> dict:
    """SGLang's own metrics per engine server: load, queues, PD queues, KV transfer."""
    rate = "[$__rate_interval]"
    sel = RUN_WORKER
    panels = [
        Panel("Simulated engine", "stat", [("simulated", f"max(sglang:simulated{{{sel}}})")], w=24, h=3,
              description="1: these engines are pd-orchestrator's simulator, not SGLang. Empty on real SGLang."),
        Panel("Running requests", "timeseries",
              [("{{worker}}", f"sum by (worker) (sglang:num_running_reqs{{{sel}}})")], w=8),
        Panel("Queued requests", "timeseries",
              [("{{worker}}", f"sum by (worker) (sglang:num_queue_reqs{{{sel}}})")], w=8),
        Panel("KV token usage", "timeseries",
              [("{{worker}}", f"max by (worker) (sglang:token_usage{{{sel}}})")], unit="percentunit", w=8),
        Panel("Generation throughput (engine-reported)", "timeseries",
              [("{{worker}}", f"sum by (worker) (sglang:gen_throughput{{{sel}}})")], w=12),
        Panel("Prompt / generation tokens per second", "timeseries",
              [("{{worker}} prompt", f"sum by (worker) (rate(sglang:prompt_tokens_total{{{sel}}}{rate}))"),
               ("{{worker}} generated", f"sum by (worker) (rate(sglang:generation_tokens_total{{{sel}}}{rate}))")],
              w=12),
        Panel("Prefill PD queues", "timeseries",
              [("{{worker}} bootstrap", f"sum by (worker) (sglang:num_prefill_bootstrap_queue_reqs{{{sel}}})"),
               ("{{worker}} inflight", f"sum by (worker) (sglang:num_prefill_inflight_queue_reqs{{{sel}}})")],
              w=12, description="Waiting for the decode handshake / KV being sent."),
        Panel("Decode PD queues", "timeseries",
              [("{{worker}} prealloc", f"sum by (worker) (sglang:num_decode_prealloc_queue_reqs{{{sel}}})"),
               ("{{worker}} transfer", f"sum by (worker) (sglang:num_decode_transfer_queue_reqs{{{sel}}})")],
              w=12, description="Waiting for KV pre-allocation / KV in flight."),
        Panel("KV transfer latency (prefill side)", "timeseries",
              _quantiles("sglang:kv_transfer_latency_ms", sel, by="worker"), unit="ms", w=8),
        Panel("KV transfer speed (mean)", "timeseries",
              [("{{worker}}", f"sum by (worker) (rate(sglang:kv_transfer_speed_gb_s_sum{{{sel}}}{rate})) / "
                              f"sum by (worker) (rate(sglang:kv_transfer_speed_gb_s_count{{{sel}}}{rate}))")],
              unit="GBs", w=8),
        Panel("KV transferred", "timeseries",
              [("{{worker}}", f"sum by (worker) (rate(sglang:kv_transfer_total_mb_sum{{{sel}}}{rate}))")],
              unit="MBs", w=8, description="MB/s of KV cache sent by each prefill server."),
    ]
    return _dashboard(
        "pdorch-engines", "PD engines", "SGLang's own /metrics of every engine server of a run.", panels,
        [_query_var("run_id", "Run", "label_values(sglang:num_running_reqs, run_id)", multi=False),
         _query_var("worker", "Worker", 'label_values(sglang:num_running_reqs{run_id="$run_id"}, worker)',
                    multi=True)],
        fed_by=("bench", "serve"),
    )


def cluster() -> dict:
    """Ray's per-node metrics (CPU, memory, GPU), from Ray's own service-discovery targets."""
    sel = 'instance=~"$node"'
    panels = [
        Panel("CPU utilisation per node", "timeseries",
              [("{{instance}}", f"avg by (instance) (ray_node_cpu_utilization{{{sel}}})")], unit="percent", w=12),
        Panel("Memory used per node", "timeseries",
              [("{{instance}}", f"sum by (instance) (ray_node_mem_used{{{sel}}})")], unit="bytes", w=12),
        Panel("GPU utilisation", "timeseries",
              [("{{instance}} GPU {{GpuIndex}}",
                f"sum by (instance, GpuIndex) (ray_node_gpus_utilization{{{sel}}})")], unit="percent", w=12,
              description="Empty on nodes without GPUs (e.g. the simulated default)."),
        Panel("GPU memory used", "timeseries",
              [("{{instance}} GPU {{GpuIndex}}", f"sum by (instance, GpuIndex) (ray_node_gram_used{{{sel}}})")],
              unit="decmbytes", w=12, description="Empty on nodes without GPUs (e.g. the simulated default)."),
    ]
    return _dashboard(
        "pdorch-cluster", "PD cluster (Ray nodes)", "Ray node metrics of the cluster a run uses.", panels,
        [_query_var("node", "Node", "label_values(ray_node_cpu_utilization, instance)", multi=True)],
        fed_by=("bench", "serve"),
    )


DASHBOARDS = {"run-overview.json": run_overview, "serving.json": serving, "engines.json": engines,
              "cluster.json": cluster}


def build_all() -> dict[str, str]:
    """file name -> JSON text of every dashboard."""
    return {name: json.dumps(make(), indent=2) + "\n" for name, make in DASHBOARDS.items()}


if __name__ == "__main__":
    for name, text in build_all().items():
        (HERE / name).write_text(text)
        print(f"wrote {HERE / name}")
