"""After a run: result.json -> PNG plots + one self-contained report.html next to it.

result.json (written by the bench driver) is read leniently; what this module uses:
  records (or results): list of RequestResult.to_dict() (index, status, prompt_len, completion_tokens,
      ttft_s, e2e_s, kv_wait_s, sent_at, done_at, prefill_worker, decode_worker, error)
  phases: [{"name", "start_s", "end_s"}] seconds since the job started (BenchMetrics.timeline_dicts())
  started_at: wall clock of the job start (default: first sent_at minus the run phase's start)
  deadline_s, run_id, layout, simulated, time_scale: optional, top level or under "metadata"
  (run.bench_record.BenchResult.to_dict() is read as it is: "results", "phases", "metadata")
Plots: throughput over time per phase, TTFT / e2e distributions, per-worker load, phase timeline vs deadline.

Usage: pd-orchestrator report runs/<id>/result.json [--out DIR]
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on CI machines or Ray workers
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from orchestrator.observe.metrics import canonical_phase
from orchestrator.observe.report import LATENCIES, PERCENTILES, LatencySummary, tpot_s
from orchestrator.phases import Phase

PLOTS = ("throughput", "latency", "workers", "timeline")
PHASE_COLOURS: dict[str, str] = {Phase.PREFLIGHT: "#f0f0f0", Phase.DATASET: "#d9d9d9", Phase.PLACEMENT: "#bbbbbb",
                 Phase.ENGINE_START: "#9ecae1", Phase.WARMUP: "#fdd0a2", Phase.RUN: "#a1d99b", Phase.REPORT: "#dadaeb",
                 Phase.DONE: "#666666"}  # keyed by the enum; a str-valued Phase also matches its plain name


@dataclass
class RunData:
    """The parts of result.json the report needs, with times relative to the job start."""

    run_id: str
    layout: str
    deadline_s: float | None
    simulated: bool | None
    records: list[dict]
    phases: list[dict]
    started_at: float

    time_scale: float = 1.0  # sim runs report phases and latencies in simulated s = wall s / time_scale
    throughput: dict[str, str] = field(default_factory=dict)  # from bench's "summary", when present
    verdict: str | None = None  # bench's deadline verdict (VALID | INVALID) and its reason
    reason: str | None = None
    rules: dict | None = None  # the verdict against the run's rules profile (orchestrator.rules, to_dict())

    @classmethod
    def from_result(cls, result: dict) -> "RunData":
        records = result.get("records", result.get("results"))
        if not isinstance(records, list):
            raise ValueError("result.json: needs a 'records' list (one RequestResult dict per prompt)")
        meta = result.get("metadata") or {}
        phases = list(result.get("phases") or [])
        time_scale = float(result.get("time_scale", meta.get("time_scale", 1.0)) or 1.0)
        sent = [r["sent_at"] for r in records if r.get("sent_at") is not None]
        started_at = result.get("started_at") or meta.get("started_at")
        if started_at is None and sent:
            # no job start recorded: the first prompt was sent when the measured run began
            run_start_s = next((p["start_s"] for p in phases if _phase_key(p["name"]) == Phase.RUN), 0.0)
            started_at = min(sent) - run_start_s * time_scale
        config = result.get("config") or meta.get("config") or {}
        deadline = result.get("deadline_s", config.get("benchmark", {}).get("deadline_s"))
        s = result.get("summary") or {}
        throughput = {}
        if s.get("duration_s"):
            throughput = {Phase.RUN.label: f"{s['duration_s']:.2f} s",
                          "total tok/s": f"{s.get('total_throughput', 0):,.0f}",
                          "output tok/s": f"{s.get('output_throughput', 0):,.0f}"}
        sim = result.get("simulation")  # sim engine: the measured run against the cost model's run of the batch
        if sim and s.get("duration_s"):
            # from the two run times, not the flags: result.json files written before 'behind_model' lack it
            slowdown = sim["measured_run_s"] / sim["modelled_run_s"] - 1 if sim.get("modelled_run_s") else 0.0
            tolerance = float(sim.get("tolerance", 0.05))  # run.fidelity.TOLERANCE, written with every simulation
            verdict = ("within the model" if abs(slowdown) <= tolerance else
                       "behind the model: the throughput above is this host's, not the simulated GPUs'"
                       if slowdown > tolerance else "faster than the model")
            throughput["vs the cost model"] = (
                f"measured run {sim['measured_run_s']:.1f} s vs modelled {sim['modelled_run_s']:.1f} s "
                f"({slowdown:+.1%}): {verdict}; modelled {sim['modelled_output_throughput']:,.0f} output / "
                f"{sim['modelled_total_throughput']:,.0f} total tok/s on {sim.get('gpu', '?')}")
        caches = [f"{w['name']} {w['cache_state']}" for w in meta.get("workers", [])
                  if w.get("cache_state", "n/a") != "n/a"]
        if caches:
            throughput["compile caches at engine start"] = ", ".join(caches)
        return cls(
            run_id=str(result.get("run_id", meta.get("run_id", "run"))),
            layout=str(result.get("layout", meta.get("layout", ""))),
            deadline_s=float(deadline) if deadline is not None else None,
            simulated=result.get("simulated", meta.get("simulated")),
            records=records, phases=phases, started_at=float(started_at or 0.0), time_scale=time_scale,
            throughput=throughput, verdict=result.get("verdict"), reason=result.get("reason"),
            rules=meta.get("rules"),
        )

    def ok(self) -> list[dict]:
        return [r for r in self.records if r.get("status") == "ok"]

    def rel(self, t: float | None) -> float | None:
        """Wall-clock time -> seconds since job start, in the unit of the phases."""
        return None if t is None else (t - self.started_at) / self.time_scale


def _phase_key(name: str) -> str:
    try:
        return canonical_phase(name)
    except ValueError:
        return name


def _colour(name: str) -> str:
    return PHASE_COLOURS.get(_phase_key(name), "#eeeeee")


def _shade_phases(ax, phases: list[dict]) -> None:
    for p in phases:
        end = p.get("end_s") if p.get("end_s") is not None else p["start_s"]
        ax.axvspan(p["start_s"], end, color=_colour(p["name"]), alpha=0.35, lw=0,
                   label=f"phase: {p['name']}")


def _save_png(fig: Figure, path: Path) -> None:
    """Write one chart (laid out, 100 dpi) and free its figure: a report draws several per run."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_throughput(data: RunData, path: Path) -> None:
    """Prefill tok/s (prompt tokens at prefill finish) and decode tok/s (output tokens at done) per second."""
    ok = data.ok()
    ends = [data.rel(r.get("done_at")) for r in ok if r.get("done_at") is not None]
    horizon = max(ends + [p.get("end_s") or p["start_s"] for p in data.phases] + [1.0])
    bins = max(1, math.ceil(horizon))
    prefill = [0.0] * bins
    decode = [0.0] * bins
    for r in ok:
        done = data.rel(r.get("done_at"))
        sent = data.rel(r.get("sent_at"))
        prefill_done = (sent + (r.get("kv_wait_s") or r.get("ttft_s") or 0.0)) if sent is not None else done
        if prefill_done is not None:
            prefill[min(int(prefill_done), bins - 1)] += r.get("prompt_len", 0)
        if done is not None:
            decode[min(int(done), bins - 1)] += r.get("completion_tokens", 0)
    fig, ax = plt.subplots(figsize=(10, 4))
    _shade_phases(ax, data.phases)
    xs = list(range(bins))
    ax.step(xs, prefill, where="post", label="prefill (input) tok/s")
    ax.step(xs, decode, where="post", label="decode (output) tok/s")
    ax.set_xlabel("seconds since job start")
    ax.set_ylabel("tokens / s")
    ax.set_title("Throughput over time, per phase")
    ax.legend(loc="upper right", fontsize=7)
    _save_png(fig, path)


def plot_latency(data: RunData, path: Path) -> None:
    """Histograms of TTFT, TPOT, KV wait and end-to-end latency over the successful requests, p50/p90/p99 marked."""
    ok = data.ok()
    samples = {"ttft": [r.get("ttft_s") for r in ok], "tpot": [tpot_s(r) for r in ok],
               "kv_wait": [r.get("kv_wait_s") for r in ok], "e2e": [r.get("e2e_s") for r in ok]}
    summary_ = LatencySummary.from_results(data.records)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title, unit) in zip(axes.flat, LATENCIES):
        scale = 1000.0 if unit == "ms" else 1.0
        values = [v * scale for v in samples[key] if v is not None]
        if values:
            ax.hist(values, bins=min(50, max(5, len(values) // 5)), color="#3182bd")
            for q, style in zip(PERCENTILES, ("--", "-.", ":")):
                v_s = summary_.get(key, f"p{q}")
                if v_s is None:
                    continue
                v = v_s * scale
                ax.axvline(v, color="black", ls=style, lw=1, label=f"p{q} = {v:.2f} {unit}")
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data" + (" (aggregated: no KV transfer)" if key == "kv_wait" else ""),
                    ha="center", transform=ax.transAxes)
        ax.set_title(f"{title} ({len(values)} requests)")
        ax.set_xlabel("milliseconds" if unit == "ms" else "seconds")
        ax.set_ylabel("requests")
    _save_png(fig, path)


def worker_load(data: RunData) -> dict[str, dict[str, float]]:
    """worker -> {requests, input_tokens, output_tokens} (prefill work on prefill workers, decode on decode)."""
    load: dict[str, dict[str, float]] = {}
    for r in data.ok():
        for worker, key, tokens in ((r.get("prefill_worker"), "input_tokens", r.get("prompt_len", 0)),
                                    (r.get("decode_worker"), "output_tokens", r.get("completion_tokens", 0))):
            if worker:
                entry = load.setdefault(worker, {"requests": 0, "input_tokens": 0, "output_tokens": 0})
                entry["requests"] += 1
                entry[key] += tokens
        if not r.get("prefill_worker") and r.get("decode_worker"):  # aggregated: prefill done there too
            load[r["decode_worker"]]["input_tokens"] += r.get("prompt_len", 0)
    return load


def plot_workers(data: RunData, path: Path) -> None:
    load = worker_load(data)
    names = sorted(load) or ["(none)"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].bar(names, [load.get(n, {}).get("requests", 0) for n in names], color="#6baed6")
    axes[0].set_title("Requests per worker")
    width = 0.4
    xs = range(len(names))
    axes[1].bar([x - width / 2 for x in xs], [load.get(n, {}).get("input_tokens", 0) for n in names], width,
                label="input tokens")
    axes[1].bar([x + width / 2 for x in xs], [load.get(n, {}).get("output_tokens", 0) for n in names], width,
                label="output tokens")
    axes[1].set_xticks(list(xs), names)
    axes[1].set_title("Tokens per worker")
    axes[1].legend(fontsize=7)
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    _save_png(fig, path)


def plot_timeline(data: RunData, path: Path) -> None:
    """Phases as bars on one time axis, with the deadline and the last request's finish."""
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.35 * max(len(data.phases), 1)))
    for i, p in enumerate(data.phases):  # one row per phase, first phase on top
        end = p.get("end_s") if p.get("end_s") is not None else p["start_s"]
        ax.barh(i, max(end - p["start_s"], 0.01), left=p["start_s"], height=0.7,
                color=_colour(p["name"]), edgecolor="black", lw=0.5)
    ax.set_yticks(range(len(data.phases)), [p["name"] for p in data.phases], fontsize=8)
    ax.invert_yaxis()
    if data.deadline_s is not None:
        ax.axvline(data.deadline_s, color="red", lw=2, label=f"deadline {data.deadline_s:.0f} s")
    ends = [t for r in data.records if (t := data.rel(r.get("done_at"))) is not None]
    if ends:
        ax.axvline(max(ends), color="black", ls="--", lw=1, label=f"last request {max(ends):.1f} s")
    ax.set_xlabel("seconds since job start")
    ax.set_title("Phase timeline vs deadline")
    ax.legend(loc="lower right", fontsize=7)
    _save_png(fig, path)


def summary(data: RunData) -> dict[str, str]:
    ok = data.ok()
    ends = [t for r in data.records if (t := data.rel(r.get("done_at"))) is not None]
    finish = max(ends) if ends else None

    rows = {
        "run id": data.run_id,
        "layout": data.layout or "-",
        "engine": {True: "simulated", False: "SGLang", None: "-"}[data.simulated],
        "prompts ok / failed": f"{len(ok)} / {len(data.records) - len(ok)}",
        "input tokens": str(sum(r.get("prompt_len", 0) for r in ok)),
        "output tokens": str(sum(r.get("completion_tokens", 0) for r in ok)),
        "last request done": "-" if finish is None else f"{finish:.1f} s after job start",
    }
    latency = LatencySummary.from_results(data.records)
    for key, label, unit in LATENCIES:
        rows[f"{label} p50 / p90 / p99"] = ("-" if latency.text(key) == "-"
                                            else latency.text(key).replace(" / ", f" {unit} / ") + f" {unit}")
    if data.throughput:
        rows.update(data.throughput)
    if data.deadline_s is not None:
        rows["deadline"] = f"{data.deadline_s:.0f} s: " + (
            "-" if finish is None else ("met" if finish <= data.deadline_s else "MISSED"))
    if data.verdict:
        rows["verdict"] = data.verdict + (f": {data.reason}" if data.reason else "")
    if data.rules:
        rows.update(rules_rows(data.rules))
    return rows


def rules_rows(rules: dict) -> dict[str, str]:
    """The rules verdict as report rows: the profile's verdict, then one row per violation with its fix."""
    name = f"rules {rules.get('profile', '?')}"
    if rules.get("error"):
        return {name: f"not checked: {rules['error']}"}
    broken = rules.get("violations") or []
    rows = {name: "compliant" if not broken else f"NOT COMPLIANT ({len(broken)} violation(s))"}
    for b in broken:
        rows[f"  {b['field']}={b['value']!r}"] = f"{b['rule']}; {b['fix']}"
    return rows


def phase_table(data: RunData) -> str:
    """The phases as an HTML table: name, start, end, duration (s since job start, the phases' unit)."""
    unit = "simulated s" if data.time_scale != 1.0 else "s"
    head = f"<tr><th>phase</th><th>start ({unit})</th><th>end</th><th>duration</th></tr>"
    rows = [f"<tr><td>{html.escape(p['name'])}</td><td>{p['start_s']:.2f}</td><td>{p['end_s']:.2f}</td>"
            f"<td>{p['end_s'] - p['start_s']:.2f}</td></tr>" for p in data.phases if p.get("end_s") is not None]
    return f'<table id="phases">\n{head}\n' + "\n".join(rows) + "\n</table>"


def write_report(result_path: str | Path | None, out_dir: str | Path | None = None,
                 document: dict | None = None) -> Path:
    """Write <plot>.png for every plot and report.html (PNGs embedded) beside result.json (or in out_dir);
    returns the HTML path. `document`: the result already read (e.g. from an archive; then out_dir is needed)."""
    if result_path is not None:
        out = Path(out_dir) if out_dir is not None else Path(result_path).parent
        document = document if document is not None else json.loads(Path(result_path).read_text())
    elif out_dir is not None and document is not None:
        out = Path(out_dir)
    else:
        raise ValueError("write_report: pass out_dir and document when the result does not come from a file")
    out.mkdir(parents=True, exist_ok=True)
    data = RunData.from_result(document)
    makers = {"throughput": plot_throughput, "latency": plot_latency, "workers": plot_workers,
              "timeline": plot_timeline}
    sections = []
    for name in PLOTS:
        png = out / f"{name}.png"
        makers[name](data, png)
        b64 = base64.b64encode(png.read_bytes()).decode()
        sections.append(f'<h2>{html.escape(name.title())}</h2>\n'
                        f'<img id="plot-{name}" alt="{name}" src="data:image/png;base64,{b64}">')
    table = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                      for k, v in summary(data).items())
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>pd-orchestrator run {html.escape(data.run_id)}</title>
<style>body{{font-family:sans-serif;margin:2em}} th{{text-align:left;padding-right:1em}} img{{max-width:100%}}</style>
</head><body>
<h1>pd-orchestrator run {html.escape(data.run_id)}</h1>
<table>
{table}
</table>
<h2>Phases</h2>
{phase_table(data)}
{chr(10).join(sections)}
</body></html>
"""
    report = out / "report.html"
    partial = out / ".report.html.partial"  # a stopped batch job takes report.html's presence for a whole report
    partial.write_text(page)
    partial.replace(report)
    return report
