"""The first seconds of each measured full run, server by server: what holds the first prefill back (issue 25, hstart).

    .venv/bin/python benchmarks/run_start_timeline.py [ROW_ID ...] [--no-model]
    (default: every measured full-run row of benchmarks/backtest/runs.yaml whose archive kept the servers' logs)
    .venv/bin/python benchmarks/run_start_timeline.py --archive RUN.tar.xz --config NAME
    (one PD / aggregated run's archive that is no back-test row, e.g. lease 9's; no model; also lists the prefill's
    iterations that took >= 1 s in run_batch before the run: the warm-up's compiles)

Per row, on the client's clock (0 = the first send), from the committed archive fullrun_phase_attribution.py reads:
  client      the sends' spread (result.json's sent_at) and the first token (the first-sent, longest prompt's)
  caches      bench's own line "engine start, compile caches: <server> warm|cold" (the product's marker check)
  before run  every forward the prefill (PD) or aggregated server ran before the first send, by its token count:
              SGLang's warm-up request, /health probes (1 token) and bench's warm-up batch; whether one of them had a
              token count divisible by 16, the class Triton compiles apart (an int argument divisible by 16 is its
              own specialisation: triton.jit's do_not_specialize_on_alignment; BaseBackend.get_int_specialization)
  run lines   the run's `Prefill batch` lines placed to ~0.1 s: SGLang 0.5.17 logs the line when it processes the
              batch's result (process_batch_result_disagg_prefill / process_batch_result_prefill), with the input
              throughput over the time since its previous line; chaining those gaps and fitting the chain into the
              lines' 1 s stamps places every line (the anchor's window is printed)
  PDO         where the prefill ran nixl_patch (every two-GPU PD product run): the run's first KV message (SGLang's
              early send of a request's cached prefix, issued just before the step's forward is enqueued), the
              PDO_ITER `run_ms` of the iterations that ran the run's first batches (run_batch's CPU time: launches,
              and any JIT compile of a kernel variant met for the first time), the first request's KV chunks, the
              decode's first `decode_seen`
  model       the planner's first prefill forward end and first token for the row (simulate_run as the back-test)

Nothing is fitted and no row, bound or term changes: this reads committed raw files.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.fullrun_phase_attribution import (  # noqa: E402
    _archive, measured_full_runs, model_run, read_measured, source_of)
from benchmarks.pd_decode_terms import _utc  # noqa: E402
from orchestrator.calibrate import kvtimeline  # noqa: E402
from orchestrator.calibrate.logparse import prefill_lines  # noqa: E402
from orchestrator.plan.backtest.dataset import DATASET, load_dataset  # noqa: E402

_CACHES = re.compile(r"engine start, compile caches: (.*)")
ALIGN = 16


def archive_texts(source: str, aggregated: bool) -> tuple[str, list[float], list[dict]]:
    """bench.txt's compile-cache line, the sends (epoch s) and the completed records of the run's result.json: the
    one of the row's mode under the archive prefix, as read_measured picks it."""
    archive, prefix = _archive(source)
    with tarfile.open(archive) as tar:
        names = [n for n in tar.getnames() if n.startswith(prefix)]

        def text(name: str) -> str:
            handle = tar.extractfile(name)
            assert handle is not None, name
            return io.TextIOWrapper(handle, encoding="utf-8", errors="replace").read()

        benches = [n for n in names if n.endswith("bench.txt")]
        caches = next((m.group(1) for n in benches if (m := _CACHES.search(text(n)))), "not printed")
        result = next(n for n in names if n.endswith("/result.json") and aggregated == ("-agg" in n.split("/")[-2]))
        ok = [r for r in json.loads(text(result))["results"] if r["status"] == "ok"]
    return caches, sorted(r["sent_at"] for r in ok), ok


def router_legs(records: list[dict], server: str, t0: float) -> dict | None:
    """When the router posted its legs to `server` (a prefill's, or an aggregated server's one leg) and read their
    answers' first bytes, sorted, seconds from t0: result.json's router stamps (None: a result.json without them).
    A streamed answer's first bytes are SGLang's response head, written by its HTTP front once it parsed the request
    and before it handed it to the tokenizer manager and the scheduler."""
    leg = "decode" if server.startswith("aggregated") else "prefill"
    mine = [r for r in records if (r.get(f"{leg}_worker") or "").split("/")[0] == server]
    posted = sorted(r[f"{leg}_posted_at"] - t0 for r in mine if r.get(f"{leg}_posted_at") is not None)
    heads = sorted(r[f"{leg}_first_byte_at"] - t0 for r in mine if r.get(f"{leg}_first_byte_at") is not None)
    return {"leg": leg, "posted": posted, "heads": heads} if posted else None


def sent_by(legs: dict | None, n: int) -> str:
    """When the router had posted n legs to the server, as " (sent by the router by +X s)"; "" without stamps."""
    return f" (sent by the router by {by_count(legs['posted'], n):+.2f} s)" if legs else ""


def by_count(times: list[float], n: int) -> float:
    """When the n-th of the sorted `times` happened (the last one past their count)."""
    return times[min(max(n, 1), len(times)) - 1]


def chain_times(lines: list[dict]) -> tuple[list[float], float]:
    """Epoch times of consecutive `Prefill batch` lines from their gaps (new tokens / input throughput = the time
    since the previous line) fitted into their 1 s stamps; and the width of the window the anchor may lie in."""
    rel = [0.0]
    for line in lines[1:]:
        rate = line.get("input_tok_s") or 0.0
        rel.append(rel[-1] + (line["new_tokens"] / rate if rate > 0 else 0.0))
    lo = max(_utc(x["t"]) - r for x, r in zip(lines, rel))
    hi = min(_utc(x["t"]) + 1.0 - r for x, r in zip(lines, rel))
    anchor = (lo + hi) / 2 if hi >= lo else lo
    return [anchor + r for r in rel], hi - lo


def server_start(name: str, text: str, t0: float, wall_s: float) -> dict:
    """One prefill / aggregated server's forwards before the run and the run's first lines (module docstring)."""
    lines = prefill_lines(text)
    in_run = [i for i, x in enumerate(lines) if t0 - 1 <= _utc(x["t"]) <= t0 + wall_s]
    chunk = max((lines[i]["new_tokens"] for i in in_run), default=0)
    # the run's first batch is a full chunk (every prompt is queued at once); what came before it, warm-up included,
    # ran before the run (1 s stamps cannot split the warm-up's last lines from the run's first by time)
    first = next((i for i in in_run if lines[i]["new_tokens"] == chunk), len(lines))
    chained = lines[first:first + 40]
    times, window = chain_times(chained) if chained else ([], 0.0)
    # since 0bb4edb the warm-up's own first forward is one full chunk too; a warm-up of ~1 s puts it inside the run's
    # first second, where the chain places it before the first send: the run's first is the next full chunk after it
    later = next((k for k, (t, x) in enumerate(zip(times, chained)) if t >= t0 - max(window, 0.0)
                  and x["new_tokens"] == chunk), 0) if window >= 0 else 0
    if later:
        first += later
        chained = lines[first:first + 40]
        times, window = chain_times(chained)
    before = [x["new_tokens"] for x in lines[:first]]
    out: dict = {"server": name, "before": before, "chunk": chunk,
                 "aligned_before": sorted({n for n in before if n > 1 and n % ALIGN == 0})}
    if first == len(lines):
        return out
    if window < 0:   # the gaps do not fit the stamps (a log written on another clock or SGLang version): not placed
        out["unplaced"] = window
        return out
    # requests the scheduler has seen at each line: admitted so far + waiting (+ a PD prefill's bootstrap queue)
    admitted, seen = 0, []
    for t, x in zip(times, chained):
        admitted += x["new_seq"]
        seen.append((t - t0, admitted + x.get("queue", 0) + x.get("bootstrap", 0)))
    out.update(first_lines=[(t - t0, x["new_seq"], x["new_tokens"]) for t, x in zip(times[:4], chained)],
               window_s=window, seen=seen)
    return out


def pdo_start(prefill: str, decode: str, t0: float) -> dict | None:
    """The run's first KV message, first iterations and first request's chunks from nixl_patch lines (None: none)."""
    chunks = [c for c in kvtimeline.chunks(prefill) if c["t_enq"] >= t0]
    if not chunks:
        return None
    first = chunks[0]
    # the iterations after the run's first KV message in log order: that message goes out just before the first
    # batch's forward is enqueued, and the iteration is logged once run_batch returned (at the next one's top)
    at = prefill.find(f"PDO_NIXL room={first['room']} chunk={first['chunk']} ")
    iters = kvtimeline.iteration_lines(prefill[at:])
    if not iters:
        return None
    room = [c for c in chunks if c["room"] == first["room"]]
    slow_before = []   # the warm-up's (and the engine's own warm-up's) slow forwards: compiles before the run
    for part in re.split(r"(?=\[[^\]]*\] PDO_ITER )", prefill[:at])[1:]:
        it = kvtimeline.iteration_lines(part)
        tok = re.search(r"Prefill batch, #new-seq: \d+, #new-token: (\d+)", part)
        if it and it[0]["run_ms"] >= 1000:
            slow_before.append((it[0]["run_ms"], int(tok.group(1)) if tok else 0))
    seen = kvtimeline.events(decode, "decode_seen")
    return {"first_msg": (first["t_enq"] - t0, first["chunk"], first["slots"]),
            "run_ms": [x["run_ms"] for x in iters[:3]], "sched_ms": [x["sched_ms"] for x in iters[:3]],
            "slow_before": slow_before, "room_chunks": [(c["chunk"], c["slots"], c["t_enq"] - t0, c["last"]) for c in room],
            "room_seen": seen[first["room"]] - t0 if first["room"] in seen else None,
            "decode_first_seen": min((t for t in seen.values() if t >= t0), default=t0 - 1) - t0}


# a reference without our router: lease 7's lone TP 1 server on the same hosts as its in-run row, fed the same 1000
# prompts by scripts/device/replay.py (one asyncio client, 1000 at once, non-streaming), its last burst (B5)
DIRECT = {"lease 7 call 4 (2 x H100 host), B5": "benchmarks/results/2026-11-27-lease7-h100/call4-agg-h100x2/lone-tp1.tar.xz",
          "lease 7 call 8 (1 x H100 host), B5": "benchmarks/results/2026-11-27-lease7-h100/call8-agg-h100x1/lone-tp1.tar.xz"}


def direct_burst(archive: Path) -> list[tuple[float, int]]:
    """Requests the lone server's scheduler had seen at each `Prefill batch` line of its last burst (the first line
    whose waiting queue jumps from empty to >= 100), seconds from that line (chained as chain_times places them)."""
    with tarfile.open(archive) as tar:
        member = next(n for n in tar.getnames() if n.endswith("/lone.log"))
        handle = tar.extractfile(member)
        assert handle is not None, member
        lines = prefill_lines(handle.read().decode(errors="replace"))
    start = max(i for i, x in enumerate(lines) if x.get("queue", 0) >= 100 and (i == 0 or not lines[i - 1].get("queue")))
    chained = lines[start:start + 12]
    times, _ = chain_times(chained)
    admitted, out = 0, []
    for t, x in zip(times, chained):
        admitted += x["new_seq"]
        out.append((t - times[0], admitted + x.get("queue", 0)))
    return out


def report(row: dict, batches: dict, with_model: bool, source: str | None = None) -> dict | None:
    source = source or source_of(row)
    if not source:
        return None
    run = read_measured(row, source)
    if not run.logs:
        return None
    caches, sends, records = archive_texts(source, "agg" in row["config"])
    firsts = sorted(r.first_s for r in run.reqs)
    burst = sum(1 for t in firsts if t <= firsts[0] + 0.05)
    print(f"\n== {row['id']}\n   caches at engine start: {caches}")
    print(f"   client: {len(sends)} sends over {sends[-1] - sends[0]:.2f} s; first token {firsts[0]:.2f} s "
          f"({burst} first tokens within 50 ms of it)")
    servers = [server_start(n, t, run.t0, run.wall_s) for n, t in sorted(run.logs.items())
               if n.startswith(("prefill", "aggregated"))]
    for s in servers:
        print(f"   {s['server']}: {len(s['before'])} forwards before the run, token counts "
              f"{sorted(set(s['before']))[:12]}{' ...' if len(set(s['before'])) > 12 else ''}; "
              f"divisible by {ALIGN} (> 1): {s['aligned_before'] or 'none'}")
        if "unplaced" in s:
            print(f"      the run's Prefill lines' gaps do not fit their stamps ({s['unplaced']:+.2f} s): not placed")
        if "first_lines" in s and s["first_lines"][0][0] > firsts[0]:
            print(f"      its first full-chunk line would fall at {s['first_lines'][0][0]:+.2f} s, after the first token: "
                  "this log's stamps are not on the client's clock; not placed")
            s["unplaced"] = s.pop("first_lines")[0][0]
        legs = router_legs(records, s["server"], run.t0)
        if legs is not None:
            posted, heads = legs["posted"], legs["heads"]
            s["router"] = {"leg": legs["leg"], "posted_99_s": by_count(posted, round(0.99 * len(posted))),
                           "heads_99_s": by_count(heads, round(0.99 * len(heads))) if heads else None}
            print(f"      the router's {legs['leg']} legs to it ({len(posted)} stamped): 99 % posted by "
                  f"{s['router']['posted_99_s']:+.2f} s (first {posted[0]:+.3f} s); the server's HTTP front answered "
                  "the head of 99 % by " + (f"{s['router']['heads_99_s']:+.2f} s" if heads else "- (none read)"))
        if "first_lines" in s:
            lines = ", ".join(f"{t:+.2f} s ({n} seq, {k:,} tok)" for t, n, k in s["first_lines"])
            print(f"      the run's first Prefill lines (each logged as its batch's result is processed; anchor "
                  f"window {s['window_s']:.2f} s): {lines}")
            seen = s["seen"]
            allin = next((t for t, n in seen if n >= 0.99 * len(sends)), None)
            print("      requests the scheduler has seen (admitted + waiting + bootstrap) at its lines: "
                  + ", ".join(f"{n} at {t:+.2f} s{sent_by(legs, n)}" for t, n in seen[:8])
                  + (f"; 99 % of the sends by {allin:+.2f} s" if allin is not None else "; not 99 % by the 40th line"))
            s["all_seen_s"] = allin
    pdo = None
    prefill = run.logs.get("prefill-0")
    if prefill is not None:
        pdo = pdo_start(prefill, run.logs.get("decode-0", ""), run.t0)
    if pdo and pdo["slow_before"]:
        print("   PDO: iterations before the run with run_batch >= 1 s (log order, ms; each followed by the Prefill "
              "line's new tokens where one follows before the next PDO_ITER): "
              + ", ".join(f"{ms:.0f}" + (f" ({n:,} tok)" if n else "") for ms, n in pdo["slow_before"]))
    if pdo:
        t, chunk, slots = pdo["first_msg"]
        print(f"   PDO: first KV message of the run at {t:+.3f} s (chunk {chunk}, {slots} slot(s): the early send of "
              f"the first request's cached prefix, just before its first forward is enqueued)")
        print(f"        first iterations' run_batch {', '.join(f'{x:.0f}' for x in pdo['run_ms'])} ms "
              f"(scheduling {', '.join(f'{x:.0f}' for x in pdo['sched_ms'])} ms)")
        chunks = "; ".join(f"chunk {c} ({n} slots) at {t:+.2f} s{' last' if last else ''}"
                           for c, n, t, last in pdo["room_chunks"])
        print(f"        first request's KV: {chunks}; decode saw it at "
              + (f"{pdo['room_seen']:+.2f} s" if pdo["room_seen"] is not None else "-")
              + f" (the decode's first decode_seen of the run {pdo['decode_first_seen']:+.2f} s)")
    out = {"id": row["id"], "caches": caches, "first_token_s": firsts[0], "servers": servers, "pdo": pdo,
           "mode": "aggregated" if "agg" in row["config"] else "PD"}
    if with_model:
        predicted = model_run(row, batches)
        out["model_prefill_end_s"] = predicted.first_prefill_end_s
        out["model_first_token_s"] = min(r.first_s for r in predicted.reqs)
        print(f"   model: first prefill forward ends {out['model_prefill_end_s']:.2f} s, first token "
              f"{out['model_first_token_s']:.2f} s")
    return out


def summary(rows: list[dict]) -> None:
    print("\n== summary: first send = 0 s")
    print(f"   {'row':48s} {'mode':10s} {'prefill/agg cache':17s} {'aligned warm-up':15s} "
          f"{'1st full chunk done':>19s} {'its run_batch':>12s} {'99 % seen':>9s} {'first token':>11s} {'model':>6s}")
    for r in rows:
        s = r["servers"][0] if r["servers"] else {}
        cache = next((c.split()[-1] for c in r["caches"].split(", ") if c.startswith(("prefill", "aggregated"))), "-")
        done = f"{s['first_lines'][0][0]:+.2f} s" if s.get("first_lines") else "-"
        run_ms = f"{r['pdo']['run_ms'][0]:.0f} ms" if r["pdo"] else "-"
        aligned = ",".join(map(str, s.get("aligned_before", []))) or "none"
        model = f"{r['model_first_token_s']:.2f}" if "model_first_token_s" in r else "-"
        allin = f"{s['all_seen_s']:+.2f} s" if s.get("all_seen_s") is not None else "-"
        print(f"   {r['id']:48s} {r['mode']:10s} {cache:17s} {aligned[:15]:15s} {done:>19s} {run_ms:>12s} "
              f"{allin:>9s} {r['first_token_s']:10.2f}s {model:>6s}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="*", help="back-test row ids (default: every measured full-run row with logs)")
    p.add_argument("--no-model", action="store_true", help="skip the planner's run of each row")
    p.add_argument("--archive", help="one run's archive (path from the repository root) instead of the rows")
    p.add_argument("--config", default="device-h100x1-1p1d", help="with --archive: the run's config name (its mode)")
    a = p.parse_args(argv)
    if a.archive:
        if not (ROOT / a.archive).is_file():
            p.error(f"--archive {a.archive}: no such file under {ROOT}")
        row = {"id": Path(a.archive).name, "config": a.config}
        done = [x for x in [report(row, {}, False, a.archive)] if x is not None]
        summary(done)
        return 0 if done else 1
    data = load_dataset(DATASET)
    rows = measured_full_runs(data)
    if a.rows:
        unknown = sorted(set(a.rows) - {r["id"] for r in rows})
        if unknown:
            p.error(f"not a measured full-run row: {', '.join(unknown)}")
        rows = [r for r in rows if r["id"] in a.rows]
    done = [x for r in rows if (x := report(r, data["batches"], not a.no_model)) is not None]
    summary(done)
    print("\n== without our router: the same 1000 prompts posted straight to a lone TP 1 server (requests its "
          "scheduler had seen, from its burst's first Prefill line; the client's own send times were not kept)")
    for label, path in DIRECT.items():
        print(f"   {label}: " + ", ".join(f"{n} at {t:+.2f} s" for t, n in direct_burst(ROOT / path)[:8]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
