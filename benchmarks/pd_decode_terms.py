"""A V2-Lite PD row term by term: its servers' logs against the planner's own trace of the same run (issue 25).

    .venv/bin/python benchmarks/pd_decode_terms.py [ROW_ID ...]     (default: the three 1P1D rows below)

For each back-test row (benchmarks/backtest/runs.yaml) of a PD pair whose raw folder keeps the servers' logs
(pd.tar.xz beside its evidence: scrape/**/decode-0-0.log, prefill-0-0.log, runs/*/result.json), side by side:

- the decode KV pool (SGLang's `KV Cache is allocated ... #tokens`) and the model's kv_capacity_tokens (MemoryTerms);
- the most requests running, KV tokens used, requests waiting for pre-allocation (#prealloc-req: SGLang's
  DecodePreallocQueue keeps 512 tokens of headroom per active request, admission.py), retracted (#retracted-req)
  and queued (#queue-req), and when the pre-allocation queue emptied;
- when the prefill server computed its last prompt (its `Prefill batch` lines, 1 s resolution; health probes of one
  token dropped) and its mean rate, against the model's last prefill forward;
- the decode timeline in four stretches (first token, ramp while prompts still land, the eager stretch with more
  running than the largest CUDA graph, the graphed tail), from the log's lines (1 s resolution) and the trace;
- every 40-step interval of the log (SGLang logs every --decode-log-interval steps: a step lasts running /
  gen throughput) against the model's decode_step_s at that interval's running batch and KV tokens: graphed and
  eager intervals apart;
- the trace is the back-test's: the batch in the row's `ordering` (the client's order, result.json's
  benchmark.ordering; checked against it here); where that is not the sampled order, the same trace in sample order
  beside it (TTFT, most running, eager stretch, run) shows what the order moves;
- for two rows of one GPU kind, step times at the same running batch, host against host (the intervals' nearest
  batch sizes): a difference there is the machine, not anything the config changes.

Nothing is fitted; the model is the shipped planner (simulate_run with max_concurrency None, as the back-test).
"""

from __future__ import annotations

import argparse
import calendar
import io
import json
import statistics
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.calibrate.logparse import decode_lines, prefill_lines, startup  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.plan.backtest.dataset import DATASET, build_batch, load_dataset, sent_batch  # noqa: E402
from orchestrator.plan.simulation.simulate import simulate_run  # noqa: E402
from orchestrator.workload.batch import order_lengths  # noqa: E402

ROWS = ("h200x2-v2lite-pd-product-warm", "h200x2-v2lite-pd-product-mem080", "h100x2-v2lite-pd-product-mem065-lease3",
        "h200x2-v2lite-pd-1p1d-ours")
# rows whose archive holds several runs: the run's folder inside it (the 2026-11-21 call 4 run is that row's 43.09 s)
ARCHIVES = {"h200x2-v2lite-pd-1p1d-ours": "benchmarks/results/device-h200x2-2026-11-21/raw.tar.xz:c4/c/"}
# the aggregated rows of the same prompts whose archive keeps the server's log: their KV pool, checked the same way
AGGREGATED_ROWS = ("h200x2-v2lite-agg-tp2-product", "h100x2-v2lite-agg-tp2-mem080-product-lease3")
LOG_INTERVAL = 40  # --decode-log-interval of these servers (SGLang's default): steps between two Decode batch lines


@dataclass
class Measured:
    kv_pool_tokens: int
    t0: float  # the first request's send (epoch s)
    duration_s: float
    decode: list[dict]  # logparse.decode_lines, t in s from t0
    prefill: list[dict]  # logparse.prefill_lines, t in s from t0
    ttft_p50_s: float
    ordering: str | None  # the client's submission order (result.json's benchmark.ordering)
    total_tok_s: float  # result.json's summary


@dataclass
class Trace:
    """The planner's run of the row: every decode step and prefill forward as it started."""

    duration_s: float = 0.0
    kv_pool_tokens: int = 0
    graph_max_bs: int = 0
    # t, running, seconds, KV used, waiting for pre-allocation, retracted, pre-allocated whose KV has not joined yet
    decode: list[tuple[float, int, float, int, int, int, int]] = field(default_factory=list)
    prefill_end_s: float = 0.0
    prefill_tokens: int = 0
    retracted: int = 0
    ttft_p50_s: float = 0.0


def _utc(local_epoch: float) -> float:
    """logparse reads a log's stamps as local time; these servers wrote UTC."""
    return float(calendar.timegm(time.localtime(local_epoch)))


def _evidence_dir(row: dict) -> Path:
    return ROOT / Path(row["evidence"].split()[0]).parent


def archive_of(row: dict, given: str | None = None) -> Path:
    """The row's server archive: `given`, else the evidence itself when it is one, else pd.tar.xz beside it, else the
    one pd*.tar.xz there (a folder with two legs, as bench_two_gpu.sh pd-ab leaves, needs --archive). `given` may end
    in :PREFIX, the run's folder inside an archive that holds several (read_measured takes members under it only)."""
    if given:
        return ROOT / given
    evidence = ROOT / row["evidence"].split()[0]
    if evidence.name.endswith(".tar.xz"):
        return evidence
    if (evidence.parent / "pd.tar.xz").is_file():
        return evidence.parent / "pd.tar.xz"
    found = sorted(evidence.parent.glob("pd*.tar.xz"))
    if len(found) != 1:
        raise SystemExit(f"{row['id']}: {len(found)} pd*.tar.xz beside {evidence.relative_to(ROOT)}; "
                         f"name the leg's archive with --archive {row['id']}=PATH")
    return found[0]


def read_measured(row: dict, archive: Path | None = None) -> Measured:
    archive = archive or archive_of(row)
    path, _, prefix = str(archive).partition(".tar.xz:")
    archive = Path(path + ".tar.xz") if prefix else archive
    texts: dict[str, str] = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = member.name
            if name.startswith(prefix) and name.endswith(("decode-0-0.log", "prefill-0-0.log", "result.json")):
                handle = tar.extractfile(member)
                assert handle is not None
                texts[name.rsplit("/", 1)[-1]] = io.TextIOWrapper(handle, encoding="utf-8", errors="replace").read()
    missing = {"decode-0-0.log", "prefill-0-0.log", "result.json"} - texts.keys()
    if missing:
        raise SystemExit(f"{archive}: no {', '.join(sorted(missing))} in the archive")
    result = json.loads(texts["result.json"])
    t0 = min(r["sent_at"] for r in result["results"])
    decode = [{**r, "t": _utc(r["t"]) - t0} for r in decode_lines(texts["decode-0-0.log"])]
    # the measured run's lines start with every prompt pre-allocated or in transfer; earlier ones are the warm-up's
    decode = decode[next((i for i, r in enumerate(decode) if r.get("transfer", 0) > 0), 0):]
    prefill = [{**r, "t": _utc(r["t"]) - t0} for r in prefill_lines(texts["prefill-0-0.log"])]
    return Measured(startup(texts["decode-0-0.log"])["kv_cache_tokens"], t0, result["duration_s"],
                    [r for r in decode if r["t"] >= -1], [r for r in prefill if r["t"] >= -1],
                    statistics.median(r["ttft_s"] for r in result["results"] if r.get("ttft_s") is not None),
                    result.get("metadata", {}).get("config", {}).get("benchmark", {}).get("ordering"),
                    result["summary"]["total_throughput"])


def decode_model(row: dict):
    """The cost model of the row's decode server (perfmodel EngineCostModel), as the planner builds it."""
    cfg = load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
    return next(cost_model_for(cfg, role, group) for role, _, group in cfg.layout.groups() if role == "decode")


def model_trace(row: dict, batches: dict, ordering: str | None = None) -> Trace:
    """The planner's run of the row as the back-test simulates it (the batch in the row's `ordering`), or with the
    requests sent in `ordering` instead (bench's order_requests)."""
    cfg = load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
    if ordering is None:
        batch = sent_batch(row, batches, DATASET.parent)
    else:
        batch = order_lengths(build_batch(batches[row["batch"]], DATASET.parent), ordering)
    decode = decode_model(row)
    trace = Trace(kv_pool_tokens=decode.kv_capacity_tokens(), graph_max_bs=max(decode.graph_batch_sizes()))

    def observe(now, server, forward, batch) -> None:
        if forward.kind == "decode":
            trace.decode.append((now, len(forward.running), forward.duration_s, batch.kv_used,
                                 len(batch.prealloc_queue), len(batch.retracted_queue), batch.preallocated))
        else:
            trace.prefill_end_s = max(trace.prefill_end_s, now + forward.duration_s)
            trace.prefill_tokens += sum(tokens for _, tokens in forward.prefill)

    run = simulate_run(cfg, batch, max_concurrency=None, sglang_version=row.get("sglang_version"), observe=observe)
    trace.duration_s, trace.retracted = run.duration_s, run.retracted
    trace.ttft_p50_s = statistics.median(run.ttft_s)
    return trace


def _stretches_measured(m: Measured) -> dict:
    """The eager stretch lies between the last graphed line before the first eager one and the first graphed line
    after the last eager one (each line closes 40 steps; stamps to the second)."""
    lines = m.decode
    eager = [i for i, r in enumerate(lines) if not r["cuda_graph"]]
    out = {"first_line": lines[0]["t"], "last_line": lines[-1]["t"], "end": m.duration_s, "eager_lines": len(eager)}
    if eager:
        out["eager_from"] = lines[max(0, eager[0] - 1)]["t"]
        out["eager_to"] = lines[min(len(lines) - 1, eager[-1] + 1)]["t"]
    return out


def _stretches_model(t: Trace) -> dict:
    eager = [s for s in t.decode if s[1] > t.graph_max_bs]
    return {"first_step": t.decode[0][0], "eager_from": eager[0][0] if eager else None,
            "eager_to": eager[-1][0] + eager[-1][2] if eager else None, "eager_steps": len(eager),
            "eager_s": sum(s[2] for s in eager), "end": t.duration_s, "steps": len(t.decode)}


def intervals(m: Measured, model) -> list[dict]:
    """Each 40-step interval between two lines once every prompt has landed (#transfer-req 0 at both ends)."""
    out = []
    for a, b in zip(m.decode, m.decode[1:]):
        if a.get("transfer", 0) or b.get("transfer", 0) or b["gen_tok_s"] <= 0:
            continue
        running = (a["running"] + b["running"]) / 2
        if running < 10:
            continue
        context = (a["tokens"] + b["tokens"]) / 2
        out.append({"running": running, "context": context, "graph": b["cuda_graph"] and a["cuda_graph"],
                    "measured_ms": 1000 * running / b["gen_tok_s"],
                    "model_ms": 1000 * model.decode_step_s(round(running), context)})
    return out


def report(row: dict, batches: dict, archive: Path | None = None) -> list[dict]:
    archive = archive or archive_of(row)
    m, t = read_measured(row, archive), model_trace(row, batches)
    measured_tps = m.total_tok_s
    print(f"\n== {row['id']}  ({row.get('machine', archive.relative_to(ROOT))})")
    print(f"   measured {m.duration_s:.1f} s ({measured_tps:,.0f} total tok/s), model {t.duration_s:.1f} s "
          f"({t.duration_s / m.duration_s - 1:+.1%} time)")
    peak_tok = max(r["tokens"] for r in m.decode)
    prealloc = [r for r in m.decode if r.get("prealloc")]
    prealloc_clear = next((r["t"] for r in m.decode if r["t"] > (prealloc[-1]["t"] if prealloc else -1)), None)
    model_pre = [s for s in t.decode if s[4]]
    print("   decode KV pool (tokens)           log {:>10,}   model {:>10,} ({:+.1%})".format(
        m.kv_pool_tokens, t.kv_pool_tokens, t.kv_pool_tokens / m.kv_pool_tokens - 1))
    print("   most KV tokens held               log {:>10,}   model {:>10,}  (pool share {:.0%} / {:.0%})".format(
        peak_tok, max(s[3] for s in t.decode), peak_tok / m.kv_pool_tokens, max(s[3] for s in t.decode) / t.kv_pool_tokens))
    print("   most requests running             log {:>10,}   model {:>10,}".format(
        max(r["running"] for r in m.decode), max(s[1] for s in t.decode)))
    print("   waiting for pre-allocation, most  log {:>10,}   model {:>10,}  (emptied by log {} s, model {} s)".format(
        max((r.get("prealloc", 0) for r in m.decode), default=0), max((s[4] for s in t.decode), default=0),
        f"{prealloc_clear:.0f}" if prealloc else "-", f"{model_pre[-1][0]:.1f}" if model_pre else "-"))
    print("   retracted requests, most          log {:>10,}   model {:>10,}".format(
        max((r.get("retracted", 0) for r in m.decode), default=0), t.retracted))
    print("   queued (#queue-req), most         log {:>10,}   model {:>10}".format(
        max((r.get("queue", 0) for r in m.decode), default=0), "-"))
    prompts = [r for r in m.prefill if not (r["new_seq"] == 1 and r["new_tokens"] <= 1)]
    last = prompts[-1]["t"]
    full = [r["input_tok_s"] for r in prompts if r["new_tokens"] == max(x["new_tokens"] for x in prompts)]
    print(f"   last prompt prefilled by          log {last:>8.0f} s   model {t.prefill_end_s:>8.1f} s   "
          f"(first prefill line at {prompts[0]['t']:.0f} s; full-chunk rate, median of the log's input "
          f"throughput {statistics.median(full):,.0f} tok/s, model {t.prefill_tokens / t.prefill_end_s:,.0f})")
    i = next(i for i, r in enumerate(m.decode) if r.get("transfer", 1) == 0 and r.get("prealloc", 1) == 0)
    model_landed = next((s[0] for s in t.decode if s[4] == 0 and s[6] == 0), None)
    print(f"   every KV landed on the decode     log {m.decode[max(0, i - 1)]['t']:.0f}-{m.decode[i]['t']:.0f} s   "
          f"model {model_landed:>8.1f} s   (log: between the last line with requests in transfer or waiting for "
          f"pre-allocation and the first without)")
    print(f"   TTFT p50 (result.json / model)    log {m.ttft_p50_s:>8.1f} s   model {t.ttft_p50_s:>8.1f} s")
    sm, st = _stretches_measured(m), _stretches_model(t)
    print(f"   first decode line / step          log {sm['first_line']:>8.0f} s   model {st['first_step']:>8.1f} s")
    if "eager_from" in sm and st["eager_from"] is not None:
        print(f"   eager stretch (> {t.graph_max_bs} running)      log {sm['eager_from']:.0f}-{sm['eager_to']:.0f} s "
              f"({sm['eager_to'] - sm['eager_from']:.0f} s, {sm['eager_lines']} lines of {LOG_INTERVAL} steps)   model "
              f"{st['eager_from']:.1f}-{st['eager_to']:.1f} s ({st['eager_s']:.1f} s, {st['eager_steps']} steps)")
    print(f"   graphed tail to the end           log {sm['end'] - sm['eager_to']:>8.0f} s   "
          f"model {st['end'] - st['eager_to']:>8.1f} s")
    if m.ordering is not None and m.ordering != row.get("ordering"):
        print(f"   WARNING: result.json says the client sent {m.ordering}, the row's ordering is {row.get('ordering')}")
    if row.get("ordering") not in (None, "arrival"):
        o = model_trace(row, batches, "arrival")
        so = _stretches_model(o)
        print(f"   sent {row['ordering']} (the row's ordering, as simulated above); in sample order the model gives: "
              f"TTFT p50 {o.ttft_p50_s:.1f} s (log {m.ttft_p50_s:.1f}), most running {max(s[1] for s in o.decode)}, "
              f"eager {so['eager_from']:.1f}-{so['eager_to']:.1f} s, run {o.duration_s:.1f} s "
              f"({o.duration_s / m.duration_s - 1:+.1%} time; the row's order {t.duration_s / m.duration_s - 1:+.1%})")
    rows = intervals(m, decode_model(row))
    for graph in (False, True):
        part = [r for r in rows if r["graph"] is graph]
        if not part:
            continue
        meas = sum(r["measured_ms"] for r in part) * LOG_INTERVAL / 1000
        mod = sum(r["model_ms"] for r in part) * LOG_INTERVAL / 1000
        print(f"   {'graphed' if graph else 'eager'} intervals ({len(part)} x {LOG_INTERVAL} steps, running "
              f"{min(r['running'] for r in part):.0f}-{max(r['running'] for r in part):.0f}): log {meas:.1f} s, "
              f"model at the log's batches {mod:.1f} s ({mod / meas - 1:+.0%})")
        for r in part:
            print(f"      running {r['running']:5.0f}  KV {r['context']:>9,.0f}  log {r['measured_ms']:6.1f} ms  "
                  f"model {r['model_ms']:6.1f} ms ({r['model_ms'] / r['measured_ms'] - 1:+.0%})")
    return rows


def aggregated_pool(row: dict, batches: dict) -> None:
    """An aggregated row's KV pool, most KV tokens and requests held, queue and retractions: log against model."""
    archive = _evidence_dir(row) / "agg-tp2.tar.xz"
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("aggregated-0-0.log"))
        handle = tar.extractfile(member)
        assert handle is not None
        text = handle.read().decode("utf-8", errors="replace")
    lines = [r for r in decode_lines(text) if r["ranks"] in ("", "TP0")]
    retract_lines = [x for x in text.splitlines() if "retract" in x.lower() and "server_args=" not in x]
    cfg = load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
    model = next(cost_model_for(cfg, role, group) for role, _, group in cfg.layout.groups() if role == "aggregated")
    run = simulate_run(cfg, sent_batch(row, batches, DATASET.parent), max_concurrency=None,
                       sglang_version=row.get("sglang_version"))
    pool = startup(text)["kv_cache_tokens"]
    print(f"\n== {row['id']} (aggregated)  KV pool log {pool:,} / model {model.kv_capacity_tokens():,} "
          f"({model.kv_capacity_tokens() / pool - 1:+.1%}); log: most KV tokens on a decode line {max(r['tokens'] for r in lines):,} "
          f"({max(r['tokens'] for r in lines) / pool:.0%} of the pool), most running {max(r['running'] for r in lines)}, "
          f"queue {max(r.get('queue', 0) for r in lines)}, retraction lines {len(retract_lines)}; model retracted {run.retracted}")


def same_batch(a: list[dict], b: list[dict], graph: bool) -> list[tuple[float, float, float]]:
    """(running, a's step ms, b's step ms) for each interval of `a` with an interval of `b` within 10 % of its batch."""
    out = []
    for x in (r for r in a if r["graph"] is graph):
        near = [y for y in b if y["graph"] is graph and abs(y["running"] - x["running"]) <= 0.1 * x["running"]]
        if near:
            y = min(near, key=lambda y: abs(y["running"] - x["running"]))
            out.append((x["running"], x["measured_ms"], y["measured_ms"]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rows", nargs="*", default=list(ROWS), help="back-test row ids (PD rows with pd.tar.xz)")
    p.add_argument("--rows-from", metavar="YAML", help="also look rows up here (runs.yaml's form under `rows:`, e.g. a "
                   "lease's pending-rows.yaml, whose rows are not in the back-test yet); give each one's --archive")
    p.add_argument("--archive", action="append", default=[], metavar="ID=PATH",
                   help="a row's server archive (repo-relative), where its folder holds more than one pd*.tar.xz")
    a = p.parse_args(argv)
    if any("=" not in x for x in a.archive):
        p.error("--archive takes ROW_ID=PATH")
    archives = {**ARCHIVES, **dict(x.split("=", 1) for x in a.archive)}
    data = load_dataset(DATASET)
    by_id = {r["id"]: r for r in data["runs"]}
    if a.rows_from:
        by_id = {**{r["id"]: r for r in yaml.safe_load((ROOT / a.rows_from).read_text())["rows"]}, **by_id}
    unknown = [r for r in a.rows if r not in by_id]
    if unknown:
        p.error(f"not in {DATASET.relative_to(ROOT)}: {', '.join(unknown)}")
    per_row = {rid: report(by_id[rid], data["batches"], archive_of(by_id[rid], archives.get(rid))) for rid in a.rows}
    for rid in AGGREGATED_ROWS if a.rows == list(ROWS) else ():
        aggregated_pool(by_id[rid], data["batches"])
    gpu_of = {rid: rid.split("-")[0] for rid in a.rows}  # the ids name the machine kind: h200x2-..., h100x2-...
    ids = list(per_row)
    for i, first in enumerate(ids):
        for second in ids[i + 1:]:
            if gpu_of[first] != gpu_of[second]:
                continue
            print(f"\n== same running batch, {second} / {first} (log step times)")
            for graph in (True, False):
                pairs = same_batch(per_row[first], per_row[second], graph)
                if not pairs:
                    continue
                ratios = sorted(b / a_ for _, a_, b in pairs)
                print(f"   {'graphed' if graph else 'eager'}: {len(pairs)} batches, median x{ratios[len(ratios) // 2]:.2f} "
                      f"(x{ratios[0]:.2f}-x{ratios[-1]:.2f}): " + ", ".join(f"{r:.0f}: {x:.1f}/{y:.1f}" for r, x, y in pairs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
