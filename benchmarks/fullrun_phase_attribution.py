"""Where each measured full run's wall goes, phase by phase, beside the planner's own run of it (issue 25, hattr).

    .venv/bin/python benchmarks/fullrun_phase_attribution.py [ROW_ID ...] [--tail-below 32]
        [--rows-from PENDING.yaml --archive ROW_ID=ARCHIVE.tar.xz]
    (default: every measured full-run row of benchmarks/backtest/runs.yaml; a row added later is read from the one
    archive beside its evidence that holds a result.json of its mode)

One phase split, applied alike to both sides, from per-request times: the run's `result.json` (each request's send,
first token and answer, the client's clock) and the planner's trace of the same run (`simulate_run` exactly as
`plan --backtest` calls it, its requests read through the `observe` hook, which changes nothing). At each instant a
server's running batch R is its requests that have their first token and no answer yet; G is its largest decode CUDA
graph. The wall, first send to the run's end, splits into
  start      first send -> the first request's first token (router, tokenizer, first prefill, KV hand-off)
  admit      until every request has its first token, every server at R <= G
  admit/eag  the same stretch while some server has R > G (its decode steps run eager while prompts still land)
  eager      every request admitted, some server at R > G
  graphed    every request admitted, R <= G on every server, R >= --tail-below in all
  tail       R < --tail-below in all (few requests: the longest outputs at the smallest steps)
  end        the last answer -> the run's end as `bench` timed it (client bookkeeping; the model has none)
Each phase: measured s, predicted s, predicted - measured, and that difference's share of the row's whole time
difference (an over-predicted row is one the model runs too fast: negative differences; shares sum to 100 %).

Then, where the archive keeps the servers' logs, the step check at the log's own batches (no schedule in it): every
`Decode batch` interval (--decode-log-interval steps; step = running / gen throughput) with no prompt landing in it
(PD: #transfer-req and #prealloc-req 0 at both ends; aggregated: no `Prefill batch` line inside), eager and graphed
apart, against the model's decode_step_s at that batch and KV: the seconds the model's step misses there. Checks on
the proxy: the log's eager lines against the client-side eager stretch, the model's eager forwards against its own.

What-if (rows with clean eager intervals): the planner re-run with every eager decode step multiplied by the row's own
log / model ratio over those intervals (eager_steps_scaled, restored on exit), schedule and admission included: how far
the right in-run eager step alone would carry the row, and what is left (start, graphed + tail). The ratio is the row's
own, so this is a diagnosis of where the error lies, never a prediction or a term to ship.

Nothing is fitted and no row, bound or term changes: this reads committed raw files and the shipped planner.
"""

from __future__ import annotations

import argparse
import bisect
import io
import statistics
import json
import re
import sys
import tarfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.pd_decode_terms import _utc  # noqa: E402
from orchestrator.calibrate.logparse import decode_lines, prefill_lines  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.plan.backtest.dataset import DATASET, load_dataset, sent_batch  # noqa: E402
from orchestrator.plan.backtest.rows import throughput_scope  # noqa: E402
from orchestrator.plan.simulation.simulate import simulate_run  # noqa: E402

R = "benchmarks/results/"
# row -> the archive holding its run (result.json, and the servers' logs where kept); ARCHIVE:PREFIX picks one run's
# folder inside an archive that holds several. None: only a summary was kept (no per-request times).
SOURCES: dict[str, str | None] = {
    "h200x2-v2lite-pd-1p1d-ours": R + "device-h200x2-2026-11-21/raw.tar.xz:c4/c/",
    "h200x2-v2lite-pd-1p1d-sglang-router": None,   # sglang_router.json: end-to-end times only, no send / first token
    "h200x2-v2lite-agg-dp2": R + "device-h200x2-2026-11-21/raw.tar.xz:c5/c/",
    "h200x2-v2lite-pd-local-cluster-1": None,      # first-run-main.log: bench's summary only
    "h200x2-v2lite-pd-local-cluster-2": R + "device-h200x2-local-cluster-2026-11-21/raw.tar.xz:local/",
    "h200x2-v2lite-pd-page64": R + "device-h200x2-local-cluster-2026-11-21/raw-page64.tar.xz:local/",
    "h200x2-v2lite-pd-product-warm": R + "2026-11-26-two-gpu-h200x2/call5-pd/pd.tar.xz",
    "h200x2-v2lite-pd-product-mem080": R + "2026-11-26-two-gpu-lease2-h200x2/call4-pd-serve/pd.tar.xz",
    "h200x2-v2lite-agg-tp2-product": R + "2026-11-26-two-gpu-h200x2/call2-pd-agg/agg-tp2.tar.xz",
    "h100x2-v2lite-pd-product-mem065-lease3": R + "2026-11-26-two-gpu-lease3-h100x2/call4-pd/pd.tar.xz",
    "h100x2-v2lite-agg-tp2-mem080-product-lease3": R + "2026-11-26-two-gpu-lease3-h100x2/call5-agg/agg-tp2.tar.xz",
    "h100x2-v2lite-agg-tp2-mem080-product-lease4": R + "2026-11-26-two-gpu-lease4-h100x2/call3-agg-ab/agg-tp2-graphs256.tar.xz",
    "h100x2-v2lite-agg-tp2-mem080-graphs1024-lease4":
        R + "2026-11-26-two-gpu-lease4-h100x2/call4-agg-graphs1024-retry/agg-tp2.tar.xz",
    "h100x2-v2lite-pd-product-mem055-lease4": R + "2026-11-26-two-gpu-lease4-h100x2/call5-pd-ab/pd-mem055.tar.xz",
    "h100x2-v2lite-pd-product-mem065-lease4": R + "2026-11-26-two-gpu-lease4-h100x2/call5-pd-ab/pd-mem065.tar.xz",
    "h200x2-v2lite-pd-product-mem065-inrun-lease5": R + "2026-11-26-two-gpu-lease5-h200x2/call3-eager-ab/pd-inrun.tar.xz",
    "h100x2-v2lite-agg-tp1-product-mem065-inrun-lease7": R + "2026-11-27-lease7-h100/call4-agg-h100x2/agg-inrun.tar.xz",
}
PHASES = ("start", "admit", "admit/eag", "eager", "graphed", "tail", "end")
_INTERVAL = re.compile(r"decode_log_interval=(\d+)")
_GRAPH_MAX = re.compile(r"cuda_graph_max_bs_decode=(\d+)")


@dataclass
class Req:
    server: str | None  # the server that decodes it (None: seen in no forward, zero decode time in the model)
    first_s: float  # first token, s from the first send
    done_s: float  # answer
    prompt_len: int = 0  # measured only (result.json): what the context of a running request is made of
    output_len: int = 0


@dataclass
class Run:
    wall_s: float
    reqs: list[Req]
    graph_max: int
    logs: dict[str, str] = field(default_factory=dict)  # server -> its log text (measured runs whose archive kept it)
    t0: float = 0.0  # the first send (epoch s), to put log stamps on the same clock
    eager_forward_s: float = 0.0  # model only: the seconds of its decode forwards that run eager
    first_prefill_end_s: float = 0.0  # model only: when its first prefill forward ends
    tokens: int = 0  # measured only: prompt + output tokens (result.json's summary)
    total_tok_s: float = 0.0  # measured only: result.json's summary


def segments(run: Run):
    """(from s, to s, each server's running batch) between consecutive first tokens and answers (a sweep)."""
    events: list[tuple[float, str | None, int]] = [(r.first_s, r.server, 1) for r in run.reqs]
    events += [(r.done_s, r.server, -1) for r in run.reqs]
    events.sort(key=lambda e: (e[0], e[2]))
    running: dict[str | None, int] = {}
    prev = events[0][0]
    for t, server, delta in events:
        if t > prev:
            yield prev, t, running
            prev = t
        running[server] = running.get(server, 0) + delta


def _eager(run: Run, running: dict[str | None, int]) -> bool:
    return any(n > run.graph_max for s, n in running.items() if s is not None)


def phase_seconds(run: Run, tail_below: int) -> dict[str, float]:
    """The wall split into PHASES (module docstring)."""
    admitted = max(r.first_s for r in run.reqs)
    out = dict.fromkeys(PHASES, 0.0)
    out["start"] = min(r.first_s for r in run.reqs)
    out["end"] = max(0.0, run.wall_s - max(r.done_s for r in run.reqs))
    for a, b, running in segments(run):
        eager = _eager(run, running)
        if a < admitted:
            out["admit/eag" if eager else "admit"] += b - a
        elif eager:
            out["eager"] += b - a
        else:
            out["graphed" if sum(running.values()) >= tail_below else "tail"] += b - a
    return out


def client_eager_span(run: Run) -> tuple[float, float] | None:
    """First and last instant some server's client-side R exceeds G (the proxy the phases use)."""
    spans = [(a, b) for a, b, running in segments(run) if _eager(run, running)]
    return (spans[0][0], spans[-1][1]) if spans else None


def _archive(source: str) -> tuple[Path, str]:
    path, _, prefix = source.partition(".tar.xz:")
    return (ROOT / (path + ".tar.xz"), prefix) if prefix else (ROOT / path, "")


def read_measured(row: dict, source: str) -> Run:
    """The run's result.json (the one of this layout under the prefix) and its decoding servers' logs."""
    archive, prefix = _archive(source)
    mode = "aggregated" if "agg" in row["config"] else "decode"
    with tarfile.open(archive) as tar:
        names = [n for n in tar.getnames() if n.startswith(prefix)]
        results = [n for n in names if n.endswith("/result.json") and (mode == "decode") != ("-agg" in n.split("/")[-2])]
        if len(results) != 1:
            raise SystemExit(f"{row['id']}: {len(results)} result.json of a {mode} run under {source}")
        run_id = results[0].split("/")[-2]

        def text(name: str) -> str:
            handle = tar.extractfile(name)
            assert handle is not None, name
            return io.TextIOWrapper(handle, encoding="utf-8", errors="replace").read()

        result = json.loads(text(results[0]))
        logs = {}
        for name in names:   # this run's scrape folder where there is one, else the only logs kept
            base = name.rsplit("/", 1)[-1]
            roles = "decode|prefill" if mode == "decode" else mode
            if re.fullmatch(rf"({roles})-\d+-0\.log", base) and (run_id in name or not any(
                    run_id in n for n in names if n.endswith(".log"))):
                logs[base.split("-")[0] + "-" + base.split("-")[1]] = text(name)
    ok = [r for r in result["results"] if r["status"] == "ok"]
    t0 = min(r["sent_at"] for r in ok)
    reqs = [Req(r["decode_worker"].split("/")[0], r["sent_at"] - t0 + r["ttft_s"], r["done_at"] - t0, r.get("prompt_len", 0),
                r.get("completion_tokens", 0)) for r in ok]
    graph_max = max((int(m.group(1)) for t in logs.values() if (m := _GRAPH_MAX.search(t))), default=0)
    summary = result["summary"]
    return Run(result["duration_s"], reqs, graph_max or model_graph_max(row), logs, t0,
               tokens=summary["total_input_tokens"] + summary["total_output_tokens"],
               total_tok_s=summary["total_throughput"])


def source_of(row: dict) -> str | None:
    """The row's archive: SOURCES', else the one archive beside its evidence holding a result.json of the row's mode
    (a row added after this script, e.g. a lease's); "" when none is found."""
    if row["id"] in SOURCES:
        return SOURCES[row["id"]]
    evidence = str(row.get("evidence", "")).split()
    if not evidence:
        return ""
    mode_agg = "agg" in row["config"]
    found = []
    for archive in sorted((ROOT / evidence[0]).parent.glob("*.tar.xz")):
        with tarfile.open(archive) as tar:
            runs = [n.split("/")[-2] for n in tar.getnames() if n.endswith("/result.json") and "/runs/" in n]
        if any(("-agg" in r) == mode_agg for r in runs):
            found.append(str(archive.relative_to(ROOT)))
    return found[0] if len(found) == 1 else ""


def server_model(row: dict):
    """The cost model of the row's decoding server (PD decode or aggregated), as the planner builds it."""
    cfg = load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
    return next(cost_model_for(cfg, role, group, sglang_version=row.get("sglang_version"))
                for role, _, group in cfg.layout.groups() if role in ("decode", "aggregated"))


def model_graph_max(row: dict) -> int:
    return max(server_model(row).graph_batch_sizes(), default=0)


@contextmanager
def eager_steps_scaled(model, factor: float):
    """A what-if, for this read only: every eager decode step of the model's class `factor` times as long while inside
    (restored on exit; nothing is saved). Used to re-run a row with its own logged eager step, schedule included."""
    cls = type(model)
    original = cls.decode_step_s

    def scaled(self, batch_size: int, context_tokens: int) -> float:
        step = original(self, batch_size, context_tokens)
        return step * factor if self.decode_runs_eager(batch_size) else step

    cls.decode_step_s = scaled
    try:
        yield
    finally:
        cls.decode_step_s = original


def model_run(row: dict, batches: dict, eager_factor: float = 1.0) -> Run:
    """The planner's run of the row as the back-test predicts it (predict_row's simulate_run call); with
    `eager_factor` != 1, the what-if of eager_steps_scaled."""
    cfg = load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
    model = server_model(row)
    if eager_factor != 1.0:
        with eager_steps_scaled(model, eager_factor):
            return model_run(row, batches)
    seen: dict[int, tuple[object, str]] = {}
    eager = [0.0]
    prefill_end: list[float] = []

    def observe(now, server, forward, schedule) -> None:
        seqs = [s for s, _ in forward.prefill] if forward.kind == "prefill" else forward.running
        for seq in seqs:
            if not server.startswith("prefill"):
                seen.setdefault(id(seq.owner), (seq.owner, server))
        if forward.kind == "decode" and model.decode_runs_eager(len(forward.running)):
            eager[0] += forward.duration_s
        if forward.kind == "prefill" and not prefill_end:
            prefill_end.append(now + forward.duration_s)

    run = simulate_run(cfg, sent_batch(row, batches, DATASET.parent), max_concurrency=None,
                       sglang_version=row.get("sglang_version"), observe=observe)
    reqs = [Req(server, owner.first_token_s, owner.finish_s) for owner, server in seen.values()]  # type: ignore[attr-defined]
    first_tokens = [t for t, e in zip(run.ttft_s, run.e2e_s) if e == t]   # answered at their first token, no forward
    reqs += [Req(None, t, t) for t in first_tokens[: run.num_requests - len(reqs)]]
    return Run(run.duration_s, reqs, max(model.graph_batch_sizes(), default=0), eager_forward_s=eager[0],
               first_prefill_end_s=prefill_end[0])


def step_check(run: Run, model) -> dict[str, dict]:
    """Clean decode intervals of each server's log in the run (module docstring), eager and graphed apart: measured
    and model seconds at the log's batches and KV."""
    out: dict[str, dict] = {}
    for server, text in run.logs.items():
        if server.startswith("prefill"):
            continue
        interval = int(m.group(1)) if (m := _INTERVAL.search(text)) else 40
        lines = [{**r, "t": _utc(r["t"]) - run.t0} for r in decode_lines(text) if r["ranks"] in ("", "TP0")]
        lines = [r for r in lines if -1 <= r["t"] <= run.wall_s + 1]
        prefills = [_utc(p["t"]) - run.t0 for p in prefill_lines(text) if p["new_tokens"] > 1]
        eager_lines = [r["t"] for r in lines if not r["cuda_graph"]]
        firsts = sorted(r.first_s for r in run.reqs if r.server == server)
        dones = sorted(r.done_s for r in run.reqs if r.server == server)
        lag = [bisect.bisect_right(firsts, r["t"]) - bisect.bisect_right(dones, r["t"]) - r["running"] for r in lines]
        summary = out.setdefault(server, {"interval": interval, "eager_lines": len(eager_lines),
                                          "eager_span": (min(eager_lines), max(eager_lines)) if eager_lines else None,
                                          "peak_running": max((r["running"] for r in lines), default=0),
                                          "client_minus_log": (statistics.median(lag), max(lag, key=abs)) if lag else None,
                                          "last_line_s": lines[-1]["t"] if lines else None})
        for a, b in zip(lines, lines[1:]):
            landing = any(x.get(k, 0) for x in (a, b) for k in ("transfer", "prealloc"))
            if landing or b["gen_tok_s"] <= 0 or any(a["t"] < p <= b["t"] for p in prefills):
                continue
            kind = "graphed" if a["cuda_graph"] and b["cuda_graph"] else "eager"
            running, context = (a["running"] + b["running"]) / 2, (a["tokens"] + b["tokens"]) / 2
            if running < 1:
                continue
            part = summary.setdefault(kind, {"n": 0, "measured_s": 0.0, "model_s": 0.0, "running": []})
            part["n"] += 1
            part["measured_s"] += interval * running / b["gen_tok_s"]
            part["model_s"] += interval * model.decode_step_s(round(running), context)
            part["running"].append(running)
    return out


def report(row: dict, batches: dict, tail_below: int, source: str | None) -> dict | None:
    """One row's tables (module docstring); `source` its archive (source_of). A row without `measured` (a lease's
    pending row, --rows-from) takes its figures from the archive's result.json."""
    measured = read_measured(row, source) if source else None
    if "measured" in row:
        tokens, tok_s = row["measured"]["input_tokens"] + row["measured"]["output_tokens"], row["measured"]["total_tok_s"]
    elif measured is not None:
        tokens, tok_s = measured.tokens, measured.total_tok_s
    else:
        raise SystemExit(f"{row['id']}: no measured figures and no archive (--archive {row['id']}=PATH)")
    predicted = model_run(row, batches)
    err = tokens / predicted.wall_s / tok_s - 1   # the back-test's error
    print(f"\n== {row['id']} (sample {row.get('sample')}; measured {tok_s:,.0f} total tok/s, "
          f"model {tokens / predicted.wall_s:,.0f}, {err:+.1%})")
    if measured is None:
        print(f"   not split: {'no archive found for this row' if source == '' else 'only a summary was kept'} "
              f"({row.get('evidence')}); model run {predicted.wall_s:.1f} s vs {row['measured']['duration_s']:.1f} s")
        return None
    assert source is not None   # measured was read from it
    ph_m, ph_p = phase_seconds(measured, tail_below), phase_seconds(predicted, tail_below)
    diff = predicted.wall_s - measured.wall_s
    print(f"   G = {measured.graph_max} (log) / {predicted.graph_max} (model); tail below {tail_below} running; "
          f"source {source.removeprefix(R)}")
    print("   phase        measured s  predicted s    diff s   share of the error")
    for p in PHASES:
        d = ph_p[p] - ph_m[p]
        print(f"   {p:10s}  {ph_m[p]:10.2f}  {ph_p[p]:11.2f}  {d:+8.2f}  {100 * d / diff:+8.0f} %")
    print(f"   {'wall':10s}  {measured.wall_s:10.2f}  {predicted.wall_s:11.2f}  {diff:+8.2f}      100 %")
    span_c, span_p = client_eager_span(measured), client_eager_span(predicted)
    print("   proxy check: client-side eager stretch " + (f"{span_c[0]:.1f}-{span_c[1]:.1f} s" if span_c else "none")
          + "; model " + (f"{span_p[0]:.1f}-{span_p[1]:.1f} s" if span_p else "none")
          + f" (its eager forwards, summed over servers, {predicted.eager_forward_s:.1f} s; phases admit/eag + eager "
          f"{ph_p['admit/eag'] + ph_p['eager']:.1f} s)")
    checks = step_check(measured, server_model(row))
    excess = {"eager": 0.0, "graphed": 0.0}
    eager_logged = [0.0, 0.0]   # clean eager intervals over every server: log s, model s
    for server, c in checks.items():
        span = c["eager_span"]
        print(f"   log {server}: every {c['interval']} steps, peak running {c['peak_running']}, eager lines "
              f"{c['eager_lines']}" + (f" ({span[0]:.0f}-{span[1]:.0f} s, each closing its interval)" if span else ""))
        if c["client_minus_log"] is not None:
            med, worst = c["client_minus_log"]
            print(f"      client-side R - the log's #running-req at its lines: median {med:+.0f}, largest {worst:+d}; "
                  f"its last decode line at {c['last_line_s']:.0f} s, the last answer at "
                  f"{max(r.done_s for r in measured.reqs):.1f} s (answers reaching the client late show here)")
        for kind in ("eager", "graphed"):
            if kind in c:
                k = c[kind]
                excess[kind] += k["model_s"] - k["measured_s"]
                if kind == "eager":
                    eager_logged[0] += k["measured_s"]
                    eager_logged[1] += k["model_s"]
                print(f"      {kind:7s} clean intervals {k['n']:3d} (running {min(k['running']):.0f}-"
                      f"{max(k['running']):.0f}): log {k['measured_s']:6.1f} s, model at the log's batches "
                      f"{k['model_s']:6.1f} s ({k['model_s'] / k['measured_s'] - 1:+.0%}; {k['model_s'] - k['measured_s']:+.1f} s)")
    if not checks:
        print("   no server log in the archive: no step check")
    else:
        # the run's first forward fills a whole chunk (every prompt is queued at once); bench's warm-up batch just
        # before the first send does not, and 1 s stamps cannot tell the two apart by time alone
        lines = [(_utc(x["t"]) - measured.t0, x["new_tokens"]) for name, text in measured.logs.items()
                 if name.startswith(("prefill", "aggregated")) for x in prefill_lines(text)]
        lines = [(t, n) for t, n in lines if -1 <= t <= measured.wall_s]
        chunk = max(n for _, n in lines)
        print(f"   start: the run's first full-chunk ({chunk:,} tokens) `Prefill batch` line at "
              f"{min(t for t, n in lines if n == chunk):.1f} s (1 s stamps; logged as the batch starts), the first token "
              f"at {ph_m['start']:.1f} s; model: first prefill forward ends at {predicted.first_prefill_end_s:.2f} s, "
              f"first token at {ph_p['start']:.2f} s")
    factor = eager_logged[0] / eager_logged[1] if eager_logged[1] else None
    err_rerun = None
    if factor is not None:
        rerun = model_run(row, batches, factor)
        err_rerun = tokens / rerun.wall_s / tok_s - 1
        ph_r = phase_seconds(rerun, tail_below)
        left = rerun.wall_s - measured.wall_s
        print(f"   what-if: the planner re-run with every eager step x{factor:.2f} (this row's log / model over its clean "
              f"eager intervals): {rerun.wall_s:.1f} s, {err_rerun:+.1%} (eager phases admit/eag + eager "
              f"{ph_r['admit/eag'] + ph_r['eager']:.1f} s, measured {ph_m['admit/eag'] + ph_m['eager']:.1f} s); left "
              f"{left:+.1f} s, of it start {ph_r['start'] - ph_m['start']:+.1f} s, graphed + tail "
              f"{ph_r['graphed'] + ph_r['tail'] - ph_m['graphed'] - ph_m['tail']:+.1f} s")
    return {"id": row["id"], "sample": row.get("sample"), "err": err, "diff": diff, "phases_m": ph_m,
            "phases_p": ph_p, "logs": bool(checks), "eager_excess": excess["eager"], "graphed_excess": excess["graphed"],
            "eager_any": bool(span_c), "err_eager_as_logged": tokens / (predicted.wall_s - excess["eager"])
            / tok_s - 1, "eager_factor": factor, "err_rerun": err_rerun}


def summary(rows: list[dict]) -> None:
    print("\n== summary: share of each row's time error (predicted - measured wall, s) by phase; then the step check at "
          "the log's own batches (model - log s over clean intervals, its share of the error) and the row's error were "
          "the model's eager steps the log's there (first order: the schedule is not re-run)")
    print(f"   {'row':46s} {'err':>6s} {'diff s':>6s}  " + " ".join(f"{p:>9s}" for p in PHASES)
          + "   eager-step s  graphed-step s  err, eager as logged  re-run with eager x (row's own)")
    for r in rows:
        shares = " ".join(f"{100 * (r['phases_p'][p] - r['phases_m'][p]) / r['diff']:+8.0f}%" for p in PHASES)
        steps = (f"{r['eager_excess']:+5.1f} ({100 * r['eager_excess'] / r['diff']:+4.0f}%)  "
                 f"{r['graphed_excess']:+5.1f} ({100 * r['graphed_excess'] / r['diff']:+4.0f}%)  "
                 f"{100 * r['err_eager_as_logged']:+6.1f}%") if r["logs"] else "  (no server log)"
        if r["err_rerun"] is not None:
            steps += f"               x{r['eager_factor']:.2f}: {100 * r['err_rerun']:+5.1f}%"
        print(f"   {r['id']:46s} {100 * r['err']:+5.1f}% {r['diff']:+6.1f}  {shares}   {steps}")


def measured_full_runs(data: dict) -> list[dict]:
    return [r for r in data["runs"] if r["kind"] == "throughput" and r.get("source") == "measured"
            and throughput_scope(r) == "run"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="*", help="back-test row ids (default: every measured full-run row)")
    p.add_argument("--tail-below", type=int, default=32, help="running requests under which the run is in its tail")
    p.add_argument("--rows-from", metavar="YAML", help="also rows of this file (runs.yaml's form under `rows:`, e.g. a "
                   "lease's pending-rows.yaml), read only where named on the command line; give each its --archive")
    p.add_argument("--archive", action="append", default=[], metavar="ID=PATH",
                   help="a row's archive (repo-relative .tar.xz holding its runs/*/result.json), instead of SOURCES'")
    a = p.parse_args(argv)
    if any("=" not in x for x in a.archive):
        p.error("--archive takes ROW_ID=PATH")
    archives = dict(x.split("=", 1) for x in a.archive)
    data = load_dataset(DATASET)
    rows = measured_full_runs(data)
    if a.rows_from:
        known = {r["id"] for r in rows}
        rows += [r for r in yaml.safe_load((ROOT / a.rows_from).read_text())["rows"]
                 if r["id"] in a.rows and r["id"] not in known]
    if a.rows:
        unknown = sorted(set(a.rows) - {r["id"] for r in rows})
        if unknown:
            p.error(f"not a measured full-run row of {DATASET.relative_to(ROOT)}"
                    f"{' or ' + a.rows_from if a.rows_from else ''}: {', '.join(unknown)}")
        rows = [r for r in rows if r["id"] in a.rows]
    done = [x for r in rows if (x := report(r, data["batches"], a.tail_below,
                                            archives.get(r["id"]) or source_of(r))) is not None]
    summary(done)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
