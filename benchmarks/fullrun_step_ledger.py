"""One full run's decoding server, step by step, beside the planner's own run of it: a step ledger (issue 25, htime).

    .venv/bin/python benchmarks/fullrun_step_ledger.py [ROW_ID ...]
    (default: every measured full-run row of benchmarks/backtest/runs.yaml whose archive kept its one decoding
    server's log; the others are named with the reason they are not read)

fullrun_phase_attribution.py splits the client's wall by the client-side running count; this reads the decoding
server's own log instead and counts steps. The server's timeline (0 = the first send, the client's clock; the
servers ran on the same host) is cut into phases that cover the wall once:
  pre        first send -> the server's first forward of the run (router, HTTP front, PD: prefill + first KV)
  prefill    aggregated: its prefill forwards before its first decode step (SGLang runs queued prefills first)
  landing    decode steps while requests still join the running batch (PD: a `Decode batch` line with
             #transfer-req, #prealloc-req or #queue-req > 0; aggregated: a `Prefill batch` line inside the interval),
             split by whether the step ran eager (/eag) or from a CUDA graph (/gr)
  eager      every request joined, the step above the largest decode CUDA graph G (`cuda graph: False`)
  graphed    every request joined, graphed, >= TAIL running
  tail       every request joined, < TAIL running
  post       the server's last `Decode batch` line -> the run's end (its last < N unlogged steps, the answer path,
             bench's bookkeeping)
Measured: SGLang logs a `Decode batch` line every N (--decode-log-interval) decode steps, with the tokens generated
since its previous line over the wall since then (metrics_reporter.report_decode_stats: num_generated_tokens /
gap_latency, num_generated_tokens += len(batch.reqs) per step), so an interval's wall is N x its mean running /
that throughput, and the lines' gaps chained and fitted into their 1 s stamps place every line (as
run_start_timeline.chain_times places `Prefill batch` lines). An interval's wall holds whatever the loop did
between the lines (KV polling, prefill forwards of an aggregated server, idle); each interval takes the phase of
its closing line. The run's first interval starts when the server's first forward of the run does (aggregated: its
last prefill line ends the prefill phase), or, on a PD decode, N steps at the next interval's step before its line.
Predicted: `simulate_run` as `plan --backtest` calls it, read through its `observe` hook (every forward as it
starts: server, kind, duration, running batch); a decode forward's phase by the same rules (landing: it starts
before the server's last request has its first token), its time its duration plus the gap to the server's next
decode forward (prefill forwards and idle between them, as in a logged interval).

Per phase: steps, seconds, ms per step and mean running, measured and predicted, and the predicted - measured
seconds split three ways (they sum to it):
  count   (steps_p - steps_m) x the measured step: the run took more or fewer steps in this phase
  mix     steps_p x (the model's step at its own batches - the model's step at the log's batches): the running
          batch evolved differently (the model's decode_step_s at each logged interval's mean running and #token)
  price   steps_p x (the model's step at the log's batches - the measured step): the step itself at equal batch
Then the PD prefill server's forwards (count, tokens, first to last, the same chaining), retractions and the
decode's queue, and a check that the chained lines fit their stamps.

Nothing is fitted and no row, bound or term changes: this reads committed raw files and the shipped planner.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.fullrun_phase_attribution import (  # noqa: E402
    _INTERVAL, measured_full_runs, read_measured, server_model, source_of)
from benchmarks.pd_decode_terms import _utc  # noqa: E402
from benchmarks.run_start_timeline import chain_times  # noqa: E402
from orchestrator.calibrate.logparse import decode_lines, prefill_lines  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.plan.backtest.dataset import DATASET, load_dataset, sent_batch  # noqa: E402
from orchestrator.plan.simulation.simulate import simulate_run  # noqa: E402

TAIL = 32
PHASES = ("pre", "prefill", "landing/gr", "landing/eag", "eager", "graphed", "tail", "post")
STEP_PHASES = PHASES[2:7]
EAGER_BINS = ((0, 400), (400, 600), (600, 10**6))
CHUNK = 8192  # SGLang's chunked-prefill size on these servers (every run's full `Prefill batch` line)


class NotReadable(Exception):
    """A row this ledger cannot read (no server log kept, or more than one decoding server)."""


@dataclass
class Interval:
    """Steps of one phase: a logged interval (measured) or one decode forward and the gap after it (predicted)."""
    phase: str
    steps: int
    wall_s: float
    running: float   # mean running batch over its steps
    model_s: float = 0.0  # measured only: the model's decode_step_s x steps at this interval's running and KV


@dataclass
class Ledger:
    wall_s: float
    pre_s: float
    prefill_s: float
    prefill_forwards: int
    post_s: float
    intervals: list[Interval] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    retracted: int = 0

    def phase_s(self, phase: str) -> float:
        fixed = {"pre": self.pre_s, "prefill": self.prefill_s, "post": self.post_s}
        return fixed[phase] if phase in fixed else sum(i.wall_s for i in self.intervals if i.phase == phase)


def phase_of(landing: bool, eager: bool, running: float) -> str:
    if landing:
        return "landing/eag" if eager else "landing/gr"
    return "eager" if eager else ("tail" if running < TAIL else "graphed")


def chain_decode(lines: list[dict], interval: int) -> tuple[list[float], list[float], float]:
    """Each line's epoch time and its interval's wall (the first one's unknown: 0), fitted into the 1 s stamps; and
    the chain's misfit: the width of the window the anchor may lie in, or, negative, how far (s) the gaps' sum drifts
    from the stamps (an interval's generated tokens are taken as N x the mean of its two lines' running batches), in
    which case the chain is centred on its stamps."""
    gaps = [0.0] + [interval * (a["running"] + b["running"]) / 2 / b["gen_tok_s"] if b["gen_tok_s"] > 0 else 0.0
                    for a, b in zip(lines, lines[1:])]
    rel = [sum(gaps[:i + 1]) for i in range(len(gaps))]
    lo = max(_utc(x["t"]) - r for x, r in zip(lines, rel))
    hi = min(_utc(x["t"]) + 1.0 - r for x, r in zip(lines, rel))
    anchor = (lo + hi) / 2 if hi >= lo else statistics.median(_utc(x["t"]) + 0.5 - r for x, r in zip(lines, rel))
    return [anchor + r for r in rel], gaps, hi - lo


def interval_parts(prev: dict | None, line: dict, interval: int, graph_max: int) -> list[tuple[bool, int, float]]:
    """The logged interval closing at `line` as [(eager, steps, mean running)]: one part, eager as the line says, or,
    where the batch crossed G between the two lines (their CUDA-graph flags differ), an eager and a graphed part split
    where a batch moving evenly between the lines' counts crosses G."""
    running = (prev["running"] + line["running"]) / 2 if prev else line["running"]
    if prev is None or prev["cuda_graph"] == line["cuda_graph"] or prev["running"] == line["running"]:
        return [(not line["cuda_graph"], interval, running)]
    hi, lo = max(prev["running"], line["running"]), min(prev["running"], line["running"])
    eager_steps = min(interval, max(0, round(interval * (hi - graph_max) / (hi - lo))))
    parts = [(True, eager_steps, (hi + graph_max + 1) / 2), (False, interval - eager_steps, (lo + graph_max) / 2)]
    return [x for x in parts if x[1] > 0]


def context_per_request(reqs: list, server: str, t: float) -> float:
    """Mean context (tokens) of a request running on `server` at `t`, from the client's records: a request runs from
    its first token to its answer, its output growing evenly over that span. (The log's #token also counts the radix
    cache's finished requests, so it is not the running context; the log's #running-req gives the count.)"""
    running = [r.prompt_len + r.output_len * (t - r.first_s) / (r.done_s - r.first_s)
               for r in reqs if r.server == server and r.first_s <= t < r.done_s]
    return statistics.mean(running) if running else 0.0


def measured_ledger(row: dict, source: str) -> Ledger:
    run = read_measured(row, source)
    decoding = [n for n in run.logs if n.startswith(("decode", "aggregated"))]
    if len(decoding) != 1:
        raise NotReadable(f"{len(decoding)} decoding server logs in its archive; this ledger reads runs with one")
    name = decoding[0]
    text = run.logs[name]
    interval = int(m.group(1)) if (m := _INTERVAL.search(text)) else 40
    t0, wall = run.t0, run.wall_s
    # the run's lines: a decode step of the run follows its first token, and bench's warm-up ended before the send
    first_token = min(r.first_s for r in run.reqs)
    lines = [x for x in decode_lines(text)
             if x["ranks"] in ("", "TP0") and t0 + first_token - 1 <= _utc(x["t"]) <= t0 + wall + 1]
    times, gaps, window = chain_decode(lines, interval)
    times = [t - t0 for t in times]
    model = server_model(row)
    notes = [f"{name}: {len(lines)} `Decode batch` lines of the run, every {interval} steps; chained into their 1 s "
             + (f"stamps with an anchor window of {window:.3f} s" if window >= 0 else
                f"stamps, centred: the gaps' sum drifts {-window:.2f} s from them (the phases' uncertainty)")]
    aggregated = name.startswith("aggregated")
    prefills = [x for x in prefill_lines(text) if t0 - 1 <= _utc(x["t"]) <= t0 + wall] if aggregated else []
    if prefills:   # from the run's first full chunk (every prompt is queued at once; the warm-up's are shorter)
        chunk = max(x["new_tokens"] for x in prefills)
        prefills = prefills[next(i for i, x in enumerate(prefills) if x["new_tokens"] == chunk):]
    # the aggregated admission: its run's prefill lines before the first decode line, chained the same way (the first
    # line's gap runs from the warm-up: its forward taken at the stretch's median rate)
    before = [x for x in prefills if _utc(x["t"]) <= _utc(lines[0]["t"])]
    prefill_s, first_forward = 0.0, times[0] - (gaps[1] if len(gaps) > 1 else 0.0)   # PD: N steps at the next interval's step
    if before:
        ptimes, pwindow = chain_times(before)
        rate = statistics.median(x["input_tok_s"] for x in before[1:]) if len(before) > 1 else before[0]["input_tok_s"]
        start = ptimes[0] - t0 - before[0]["new_tokens"] / rate
        prefill_s = ptimes[-1] - t0 - start
        first_forward = start
        notes.append(f"{name}: {len(before)} prefill forwards before its first decode step ({sum(x['new_tokens'] for x in before):,} "
                     f"tokens), chained with an anchor window of {pwindow:.3f} s; the first one's wall at the stretch's "
                     f"median {rate:,.0f} tok/s")
    joining = [i for i, x in enumerate(lines) if x.get("transfer", 0) or x.get("prealloc", 0) or x.get("queue", 0)]
    if joining and joining[-1] + 1 < len(lines):
        notes.append(f"{name}: requests still joining (#transfer-req, #prealloc-req or #queue-req > 0) at its line at "
                     f"{times[joining[-1]]:.2f} s, none at the next, {times[joining[-1] + 1]:.2f} s")
    led = Ledger(wall, max(first_forward, 0.0), prefill_s, len(before), wall - times[-1], notes=notes,
                 retracted=max((x.get("retracted", 0) for x in lines), default=0))
    first_step_start = first_forward + prefill_s if before else first_forward
    # SGLang's decode-step counter runs on from the warm-up, so the run's first line closes 1..N of its steps: where
    # the interval's start is known (aggregated: its prefills end) they are its wall over the next interval's step;
    # a PD decode's first interval (a batch of a few requests: ~5 ms steps) is taken as N steps before its line
    first_steps = interval
    if before and len(gaps) > 1 and gaps[1] > 0:
        first_steps = min(interval, max(1, round((times[0] - first_step_start) / (gaps[1] / interval))))
    notes.append(f"{name}: the run's first line closes {first_steps} of its steps" + (" (taken as N)" if not before else
                 f" (its wall {times[0] - first_step_start:.2f} s over the next interval's step)"))
    for i, (line, t) in enumerate(zip(lines, times)):
        prev = lines[i - 1] if i else None
        begin = times[i - 1] if i else first_step_start
        landing = any(x is not None and (x.get("transfer", 0) or x.get("prealloc", 0) or x.get("queue", 0))
                      for x in (prev, line))
        landing = landing or any(begin < _utc(p["t"]) - t0 <= t for p in prefills if p not in before)
        per_request = context_per_request(run.reqs, name, (begin + t) / 2)
        parts = interval_parts(prev, line, interval if i else first_steps, run.graph_max)
        priced = [(eager, n, r, n * model.decode_step_s(max(1, round(r)), int(per_request * r)))
                  for eager, n, r in parts]
        total = sum(x[3] for x in priced)
        for eager, n, r, model_s in priced:
            led.intervals.append(Interval(phase_of(landing, eager, r), n, (t - begin) * model_s / total, r, model_s))
    stamps = (_utc(lines[-1]["t"]) - _utc(lines[1]["t"])) if len(lines) > 1 else 0.0
    led.notes.append(f"check: the chained gaps from the run's second line to its last sum to {sum(gaps[2:]):.2f} s, their "
                     f"stamps {stamps:.0f} s apart (1 s resolution)")
    led.notes.append(f"{name}: peak #retracted-req {led.retracted}, peak #queue-req "
                     f"{max((x.get('queue', 0) for x in lines), default=0)}, peak running {max(x['running'] for x in lines)}")
    return led


def predicted_ledger(row: dict, batches: dict) -> tuple[Ledger, list[str]]:
    """The planner's run of the row (simulate_run exactly as the back-test calls it) cut into the same phases."""
    cfg = load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
    model = server_model(row)
    forwards: list[tuple[float, str, str, float, int, int]] = []
    owners: dict[str, list] = {}

    def observe(now, server, forward, schedule) -> None:
        tokens = sum(n for _, n in forward.prefill)
        forwards.append((now, server, forward.kind, forward.duration_s, len(forward.running), tokens))
        if not server.startswith("prefill"):
            for seq in ([s for s, _ in forward.prefill] if forward.kind == "prefill" else forward.running):
                owners.setdefault(server, []).append(seq.owner)

    run = simulate_run(cfg, sent_batch(row, batches, DATASET.parent), max_concurrency=None,
                       sglang_version=row.get("sglang_version"), observe=observe)
    decoding = sorted({s for _, s, k, *_ in forwards if k == "decode"})
    if len(decoding) != 1:
        raise NotReadable(f"the model has {len(decoding)} decoding servers; this ledger reads one")
    name = decoding[0]
    mine = [f for f in forwards if f[1] == name]
    decodes = [f for f in mine if f[2] == "decode"]
    last_join = max(o.first_token_s for o in owners[name])
    first = mine[0][0]
    led = Ledger(run.duration_s, first, decodes[0][0] - first,
                 sum(1 for f in mine if f[2] == "prefill" and f[0] < decodes[0][0]),
                 run.duration_s - (decodes[-1][0] + decodes[-1][3]), retracted=run.retracted)
    for i, (start, _, _, duration, running, _) in enumerate(decodes):
        end = decodes[i + 1][0] if i + 1 < len(decodes) else start + duration
        led.intervals.append(Interval(phase_of(start < last_join, model.decode_runs_eager(running), running), 1,
                                      end - start, running))
    idle = sum(max(0.0, b[0] - (a[0] + a[3])) for a, b in zip(mine, mine[1:]))
    prefill_in = sum(f[3] for f in mine if f[2] == "prefill" and f[0] >= decodes[0][0])
    notes = [f"model {name}: {len(decodes)} decode forwards, {led.prefill_forwards} prefill forwards before its first "
             f"decode step, {prefill_in:.2f} s of prefill forwards after it, {idle:.2f} s idle between its forwards; "
             f"its last request joined at {last_join:.2f} s; retracted {run.retracted}"]
    prefill = [f for f in forwards if f[1].startswith("prefill") and f[2] == "prefill"]
    if prefill:
        notes.append(f"model prefill servers: {len(prefill)} forwards, {sum(f[5] for f in prefill):,} tokens, "
                     f"{prefill[0][0]:.2f} -> {prefill[-1][0] + prefill[-1][3]:.2f} s, mean forward "
                     f"{1000 * statistics.mean(f[3] for f in prefill):.0f} ms")
    return led, notes


def pd_prefill_measured(row: dict, source: str) -> str | None:
    """The PD prefill server's run forwards from its `Prefill batch` lines (chained as run_start_timeline does)."""
    run = read_measured(row, source)
    text = run.logs.get("prefill-0")
    if text is None:
        return None
    # one-token forwards are SGLang's /health probes, not the run's prompts
    lines = [x for x in prefill_lines(text) if run.t0 - 1 <= _utc(x["t"]) <= run.t0 + run.wall_s and x["new_tokens"] > 1]
    chunk = max(x["new_tokens"] for x in lines)
    lines = lines[next(i for i, x in enumerate(lines) if x["new_tokens"] == chunk):]   # the run's first full chunk on
    times, window = chain_times(lines)
    gaps = [b - a for a, b in zip(times, times[1:])]
    return (f"measured prefill-0: {len(lines)} forwards from the run's first full chunk, "
            f"{sum(x['new_tokens'] for x in lines):,} tokens, lines at {times[0] - run.t0:.2f} -> {times[-1] - run.t0:.2f} s "
            f"(anchor window {window:.3f} s), median gap {1000 * statistics.median(gaps):.0f} ms (a forward and its "
            "loop turn; the first forward's own time is in the gap before its line)")


def split(meas: list[Interval], pred: list[Interval]) -> tuple[float, float, float]:
    """(count, mix, price) seconds of one phase (module docstring)."""
    n_m, n_p = sum(i.steps for i in meas), sum(i.steps for i in pred)
    if not n_m or not n_p:
        return (sum(i.wall_s for i in pred) - sum(i.wall_s for i in meas), 0.0, 0.0)
    t_m = sum(i.wall_s for i in meas) / n_m
    t_p = sum(i.wall_s for i in pred) / n_p
    t_model_at_m = sum(i.model_s for i in meas) / n_m
    return (n_p - n_m) * t_m, n_p * (t_p - t_model_at_m), n_p * (t_model_at_m - t_m)


def report(row: dict, batches: dict) -> dict:
    source = source_of(row)
    if not source:
        raise NotReadable("no archive with per-request times (a summary only)")
    meas = measured_ledger(row, source)
    pred, notes = predicted_ledger(row, batches)
    tokens = row["measured"]["input_tokens"] + row["measured"]["output_tokens"]
    err = tokens / pred.wall_s / row["measured"]["total_tok_s"] - 1
    diff = pred.wall_s - meas.wall_s
    print(f"\n== {row['id']} (sample {row.get('sample')}): measured {meas.wall_s:.2f} s, predicted {pred.wall_s:.2f} s, "
          f"{err:+.1%} in total tok/s; predicted - measured {diff:+.2f} s")
    print(f"   {'phase':12s} {'steps m':>8s} {'steps p':>8s} {'s m':>7s} {'s p':>7s} {'ms/step m':>9s} {'ms/step p':>9s} "
          f"{'ms model@m':>10s} {'R m':>5s} {'R p':>5s} {'diff s':>7s} {'share':>6s} {'count s':>7s} {'mix s':>6s} {'price s':>7s}")
    out: dict = {"id": row["id"], "err": err, "diff": diff, "phases": {}}
    for phase in PHASES:
        m_s, p_s = meas.phase_s(phase), pred.phase_s(phase)
        d = p_s - m_s
        out["phases"][phase] = {"measured_s": m_s, "predicted_s": p_s}
        if phase not in STEP_PHASES:
            extra = (f" ({meas.prefill_forwards} / {pred.prefill_forwards} forwards)" if phase == "prefill" else "")
            print(f"   {phase:12s} {'':>8s} {'':>8s} {m_s:7.2f} {p_s:7.2f} {'':>9s} {'':>9s} {'':>10s} {'':>5s} {'':>5s} "
                  f"{d:+7.2f} {100 * d / diff:+5.0f}%{extra}")
            continue
        mi = [i for i in meas.intervals if i.phase == phase]
        pi = [i for i in pred.intervals if i.phase == phase]
        n_m, n_p = sum(i.steps for i in mi), sum(i.steps for i in pi)

        def per_step(xs: list[Interval], n: int, attr: str = "wall_s") -> str:
            return f"{1000 * sum(getattr(i, attr) for i in xs) / n:.1f}" if n else "-"

        def mean_r(xs: list[Interval], n: int) -> str:
            return f"{sum(i.running * i.steps for i in xs) / n:.0f}" if n else "-"

        count, mix, price = split(mi, pi)
        out["phases"][phase].update(steps_m=n_m, steps_p=n_p, count_s=count, mix_s=mix, price_s=price)
        print(f"   {phase:12s} {n_m:8d} {n_p:8d} {m_s:7.2f} {p_s:7.2f} {per_step(mi, n_m):>9s} {per_step(pi, n_p):>9s} "
              f"{per_step(mi, n_m, 'model_s'):>10s} {mean_r(mi, n_m):>5s} {mean_r(pi, n_p):>5s} {d:+7.2f} "
              f"{100 * d / diff:+5.0f}% {count:+7.2f} {mix:+6.2f} {price:+7.2f}")
    total_m = sum(meas.phase_s(p) for p in PHASES)
    total_p = sum(pred.phase_s(p) for p in PHASES)
    steps_m, steps_p = sum(i.steps for i in meas.intervals), sum(i.steps for i in pred.intervals)
    print(f"   {'all':12s} {steps_m:8d} {steps_p:8d} {total_m:7.2f} {total_p:7.2f}{'':>47s} {total_p - total_m:+7.2f}  (walls "
          f"{meas.wall_s:.2f} / {pred.wall_s:.2f} s)")
    for k in ("count", "mix", "price"):
        out[k] = sum(v.get(k + "_s", 0.0) for v in out["phases"].values())
    eager_m = [i for i in meas.intervals if i.phase in ("landing/eag", "eager")]
    out["eager_steps"] = (sum(i.steps for i in eager_m), sum(i.steps for i in pred.intervals
                                                             if i.phase in ("landing/eag", "eager")))
    out["eager_ratio"] = (sum(i.wall_s for i in eager_m) / sum(i.model_s for i in eager_m)) if eager_m else None
    out["eager_price"] = sum(out["phases"][p].get("price_s", 0.0) for p in ("landing/eag", "eager"))
    # the row's error were its eager steps (while landing and after) priced as measured, all else as predicted
    out["err_eager_as_measured"] = tokens / (pred.wall_s - out["eager_price"]) / row["measured"]["total_tok_s"] - 1
    print(f"   decode steps, all phases: count {out['count']:+.2f} s, mix {out['mix']:+.2f} s, price {out['price']:+.2f} s; "
          f"pre + prefill + post {sum(out['phases'][p]['predicted_s'] - out['phases'][p]['measured_s'] for p in ('pre', 'prefill', 'post')):+.2f} s")
    bins = []
    for lo, hi in EAGER_BINS:
        mi = [i for i in meas.intervals if i.phase in ("landing/eag", "eager") and lo <= i.running < hi]
        pi = [i for i in pred.intervals if i.phase in ("landing/eag", "eager") and lo <= i.running < hi]
        n_m, n_p = sum(i.steps for i in mi), sum(i.steps for i in pi)
        if n_m:
            bins.append(f"{lo}-{hi - 1 if hi < 10**6 else ''}: {n_m} / {n_p} steps, {1000 * sum(i.wall_s for i in mi) / n_m:.0f} ms "
                        f"(model at the log's batches {1000 * sum(i.model_s for i in mi) / n_m:.0f})")
    if bins:
        print("   eager steps by running batch, measured / predicted steps, measured ms per step: " + "; ".join(bins))
    if meas.prefill_forwards:
        model = server_model(row)
        print(f"   prefill forwards: measured {1000 * meas.prefill_s / meas.prefill_forwards:.0f} ms each, predicted "
              f"{1000 * pred.prefill_s / max(pred.prefill_forwards, 1):.0f}; the model's forward of 20 fresh prompts of "
              f"{CHUNK // 20} tokens (about one {CHUNK:,}-token chunk): GPU work "
              f"{1000 * model.prefill_time_s([CHUNK // 20] * 20):.0f} ms, its launch {1000 * model.prefill_launch_s(20):.0f} ms "
              f"(its decode step of 500 running: {1000 * model.decode_step_s(500, 500 * 400):.0f} ms)")
    for note in meas.notes + notes:
        print(f"   {note}")
    if (pd := pd_prefill_measured(row, source)) is not None:
        print(f"   {pd}")
    return out


def summary(rows: list[dict]) -> None:
    print("\n== summary: predicted - measured seconds by phase (share of the row's difference); decode steps split into "
          "count / mix / price")
    print(f"   {'row':50s} {'err':>6s} {'diff s':>7s} " + " ".join(f"{p:>12s}" for p in PHASES)
          + f" {'count':>7s} {'mix':>7s} {'price':>7s}")
    for r in rows:
        cells = " ".join(f"{r['phases'][p]['predicted_s'] - r['phases'][p]['measured_s']:+6.2f} ({100 * (r['phases'][p]['predicted_s'] - r['phases'][p]['measured_s']) / r['diff']:+3.0f}%)"
                         for p in PHASES)
        print(f"   {r['id']:50s} {100 * r['err']:+5.1f}% {r['diff']:+7.2f} {cells} {r['count']:+7.2f} {r['mix']:+7.2f} "
              f"{r['price']:+7.2f}")
    print("\n   eager steps (landing/eag + eager): steps measured / predicted, the measured step over the model's at the "
          "log's batches, the price of those steps (s, share), and the row's error were they priced as measured")
    for r in rows:
        ratio = f"x{r['eager_ratio']:.2f}" if r["eager_ratio"] else "-"
        print(f"   {r['id']:50s} {r['eager_steps'][0]:4d} / {r['eager_steps'][1]:4d}  {ratio:>6s}  {r['eager_price']:+7.2f} s "
              f"({100 * r['eager_price'] / r['diff']:+4.0f}%)  {100 * r['err']:+5.1f}% -> {100 * r['err_eager_as_measured']:+5.1f}%")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="*", help="back-test row ids (default: every measured full-run row it can read)")
    a = p.parse_args(argv)
    data = load_dataset(DATASET)
    rows = {r["id"]: r for r in measured_full_runs(data)}
    unknown = [r for r in a.rows if r not in rows]
    if unknown:
        p.error(f"not a measured full-run row of {DATASET.relative_to(ROOT)}: {', '.join(unknown)}")
    done = []
    for row_id in a.rows or list(rows):
        try:
            done.append(report(rows[row_id], data["batches"]))
        except NotReadable as why:
            print(f"\n== {row_id}: not read: {why}")
    summary(done)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
