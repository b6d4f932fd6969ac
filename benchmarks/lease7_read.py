"""Lease 7 (issue 25, hgpu7): the in-run eager profile read against its pre-registered outcome table.

Reads only the raw files of benchmarks/results/2026-11-27-lease7-h100/ (no model is fitted) and the predictions of
benchmarks/results/2026-11-27-lease7-predicted/ (H100-SXM):
- per call (call4 = the pre-registered call on 2 x H100, call8 = its repeat on 1 x H100): A's engine log (the
  aggregated TP 1 row through the product), the lone server's log with the B1 rounds (call4), B1p's round and B5
  (the 1000 ShareGPT prompts straight to the server); clean eager lines (graph off, queue 0, no prefill line since
  the previous decode line, the first decode line after a prefill dropped), each marked perturbed where its 10-step
  interval overlaps a py-spy window (from the watcher's trigger to its last command + 1 s);
- the py-spy records (`record.raw`, call8 only: call4's `-d 10.0` was refused): the scheduler main thread's
  samples per pre-registered category;
- the 1 Hz CPU sampler: the scheduler main thread's share of a core inside and outside the py-spy windows.
Then each pre-registered test, and (not pre-registered) every unperturbed clean eager line's step over the model's
step at its batch: the slow (> x1.4) and fast lines per variant. --points writes call4's B1 rounds as a
`pdo-calibration-raw/1` file for the back-test's point rows; --pyspy-dir pyspy_summary.py's summaries of call 8's
records (main thread); --result-a call 4's A summary for its row; --json
writes everything printed.

Usage: .venv/bin/python benchmarks/lease7_read.py [--points OUT.json] [--pyspy-dir DIR] [--result-a OUT.json] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import statistics
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.eager_inrun_read import interp  # noqa: E402
from orchestrator.calibrate.logparse import decode_lines, timestamped  # noqa: E402

LEASE = ROOT / "benchmarks/results/2026-11-27-lease7-h100"
PREDICTED = ROOT / "benchmarks/results/2026-11-27-lease7-predicted/eager-step-predicted.json"
CALLS = {"call4": "call4-agg-h100x2", "call8": "call8-agg-h100x1"}
CATEGORIES = {   # pre-registered (README of 2026-11-27-lease7-predicted), each inclusive
    "run_batch": r"Scheduler\.run_batch \(", "sync": r"Synchroniz|cuStreamQuery|cuEventQuery|synchronize \(",
    "result": r"process_batch_result", "finish": r"_handle_finish_state_updated_req|cache_finished_req|release_kv_cache",
    "stream": r"stream_output", "filter": r"filter_batch", "schedule": r"get_next_batch_to_run",
    "recv": r"recv_requests|process_input_requests", "sample": r"launch_batch_sample_if_needed", "gil": r"take_gil",
    # not categories of the table: what the record caught (decode or prefill forwards)
    "decode_forward": r"_execute_decode", "extend_forward": r"_execute_extend",
}
SLOW = 1.4   # a line slower than x1.4 the model's step at its batch (not pre-registered: the read's own split)


class Tar:
    def __init__(self, path: Path) -> None:
        self.tar = tarfile.open(path)
        self.names = self.tar.getnames()

    def text(self, pattern: str) -> str | None:
        name = next((n for n in self.names if re.search(pattern, n)), None)
        if name is None:
            return None
        data = self.tar.extractfile(name)
        return data.read().decode(errors="replace") if data else None


def model_step(batch: float) -> float:
    rows = json.loads(PREDICTED.read_text())["H100-SXM"]["A aggregated TP 1 in-run / B5 ShareGPT direct"]["rows"]
    return interp({r["batch"]: r["step_ms"] for r in rows}, batch)


def windows(*metas: dict | None) -> list[tuple[float, float]]:
    out = []
    for m in metas:
        if m and m.get("triggered_at") and m.get("calls"):
            out.append((m["triggered_at"], max(c["t1"] for c in m["calls"]) + 2.0))   # + the 1 s thread snapshot
    return out


def eager_lines(log: str, t0: float = 0.0, t1: float = 1e12, perturbed: list[tuple[float, float]] | None = None) -> list[dict]:
    """Clean eager decode lines between t0 and t1, each with its step and whether py-spy ran during its interval."""
    out, prev_t, after_prefill = [], None, True
    for ts, msg in timestamped(log):
        if not t0 <= ts <= t1:
            continue
        if msg.startswith("Prefill batch"):
            after_prefill = True
            continue
        rows = decode_lines(f"[2026-01-01 00:00:00] {msg}") if msg.startswith("Decode batch") else []
        if not rows:
            continue
        r = rows[0]
        if not r["cuda_graph"] and r.get("queue", 0) == 0 and not after_prefill and r["gen_tok_s"] > 0 and prev_t:
            hit = any(prev_t < b and ts + 1 > a for a, b in perturbed or [])   # 1 s log resolution
            out.append({"t": ts, "running": r["running"], "step_ms": round(1e3 * r["running"] / r["gen_tok_s"], 1),
                        "model_ms": round(model_step(r["running"]), 1), "perturbed": hit})
        after_prefill, prev_t = False, ts
    return out


def profile(raw: str | None, main_tid: int) -> dict | None:
    if not raw:
        return None
    counts = dict.fromkeys(CATEGORIES, 0)
    total = 0
    for line in raw.splitlines():
        stack, n = line.rsplit(" ", 1)
        if not stack.startswith(f"thread ({main_tid})"):
            continue
        total += int(n)
        for key, pattern in CATEGORIES.items():
            if re.search(pattern, stack):
                counts[key] += int(n)
    return {"samples": total, **{k: round(v / total, 4) for k, v in counts.items()}} if total else None


def main_thread_share(cpu: Path, tid: int, spans: list[tuple[float, float]]) -> dict:
    inside: list[int] = []
    outside: list[int] = []
    with lzma.open(cpu, "rt") as f:
        for line in f:
            row = json.loads(line)
            if row["kind"] != "sample":
                continue
            for t in row["threads"]:
                if t[0] == tid and t[1] == tid:
                    (inside if any(a <= row["t"] <= b for a, b in spans) else outside).append(t[3])
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    return {"ticks_per_s_median_inside_pyspy": med(inside), "ticks_per_s_median_outside": med(outside),
            "samples_inside": len(inside), "samples_outside": len(outside)}


def summary(lines: list[dict], b1: dict[int, float] | None) -> dict:
    clean = [x for x in lines if not x["perturbed"]]
    out: dict = {"lines": len(lines), "unperturbed": len(clean)}
    if not clean:
        return out
    out["step_ms_median"] = statistics.median(x["step_ms"] for x in clean)
    out["running"] = [min(x["running"] for x in clean), max(x["running"] for x in clean)]
    out["over_model_median"] = round(statistics.median(x["step_ms"] / x["model_ms"] for x in clean), 3)
    out["slow_share"] = round(sum(x["step_ms"] > SLOW * x["model_ms"] for x in clean) / len(clean), 3)
    if b1:
        out["R"] = round(statistics.median(x["step_ms"] / interp(b1, x["running"]) for x in clean), 3)
        out["excess_ms"] = round(statistics.median(x["step_ms"] - interp(b1, x["running"]) for x in clean), 1)
    return out


def read_call(call: str) -> dict:
    d = LEASE / CALLS[call]
    agg, lone = Tar(d / "agg-inrun.tar.xz"), Tar(d / "lone-tp1.tar.xz")
    meta = lambda t, sub: json.loads(t.text(f"{sub}/meta.json$") or "null")  # noqa: E731
    m_a, m_b1, m_b5 = meta(agg, "pyspy"), meta(lone, "pyspy-b1"), meta(lone, "pyspy-b5")
    result = json.loads(agg.text(r"runs/[^/]+/result\.json$") or "{}").get("summary", {})
    log_a = agg.text(r"scrape/[^/]+/aggregated-0-0\.log$") or ""
    log_b = lone.text(r"lone\.log$") or ""
    b1_rounds = json.loads(lone.text(r"lone-b1\.json$") or '{"rounds": []}')["rounds"]
    prof_rounds = json.loads(lone.text(r"lone-prof\.json$") or '{"rounds": []}')["rounds"]
    b1 = {r["batch"]: r["step_ms_median"] for r in b1_rounds if r["step_ms_median"]}
    spans = windows(m_a, m_b1, m_b5)
    p0, p1 = (prof_rounds[0]["t0"], prof_rounds[0]["t1"]) if prof_rounds else (0.0, 0.0)
    lines = {"A": eager_lines(log_a, perturbed=spans), "B1p": eager_lines(log_b, p0, p1, spans),
             "B5": eager_lines(log_b, p1 + 0.5, perturbed=spans) if p1 else []}
    for r in b1_rounds:
        lines[f"B1-{r['batch']}"] = eager_lines(log_b, r["t0"], r["t1"], spans)
    out = {"result_A": {k: result.get(k) for k in ("duration_s", "total_throughput", "successful_requests")},
           "b1_round_medians": b1, "pyspy_windows": spans,
           "records": {"A": m_a and m_a.get("record"), "B1p": m_b1 and m_b1.get("record"), "B5": m_b5 and m_b5.get("record")},
           "summaries": {k: summary(v, b1 or None) for k, v in lines.items()}, "lines": lines,
           "profiles": {"A": profile(agg.text(r"pyspy/record\.raw$"), m_a["scheduler_pid"]) if m_a else None,
                        "B1p": profile(lone.text(r"pyspy-b1/record\.raw$"), m_b1["scheduler_pid"]) if m_b1 else None,
                        "B5": profile(lone.text(r"pyspy-b5/record\.raw$"), m_b5["scheduler_pid"]) if m_b5 else None}}
    if m_a:
        out["main_thread_A"] = main_thread_share(d / "cpu-agg.jsonl.xz", m_a["scheduler_pid"], spans[:1])
    return out


def write_main_thread_profiles(out: Path) -> None:
    """Call 8's records cut to the scheduler main thread (the other threads are idle Python threads sampled with
    --idle), each summarised by benchmarks/pyspy_summary.py as the router profiles of 2026-11-24 were. The raw
    stacks stay in the call's tarballs (2.6-2.8 MB each here: the tree travels to every device call)."""
    from benchmarks.pyspy_summary import summarise

    d = LEASE / CALLS["call8"]
    agg, lone = Tar(d / "agg-inrun.tar.xz"), Tar(d / "lone-tp1.tar.xz")
    for variant, tar, sub in (("a", agg, "pyspy"), ("b1p", lone, "pyspy-b1"), ("b5", lone, "pyspy-b5")):
        meta, raw = json.loads(tar.text(f"{sub}/meta.json$") or "{}"), tar.text(f"{sub}/record\\.raw$") or ""
        main = [line for line in raw.splitlines() if line.startswith(f"thread ({meta.get('scheduler_pid')})")]
        (out / f"pyspy-{variant}-main.summary.txt").write_text(summarise(main))


def tests(c4: dict, c8: dict) -> list[tuple[str, str, str]]:
    s = c4["summaries"]
    r_a, r_b5 = s["A"].get("R"), s["B5"].get("R")
    ex_a, ex_b5 = s["A"].get("excess_ms"), s["B5"].get("excess_ms")
    rows = [("Q1", f"R_A = {r_a} (call 4, A over B1 at equal batch)", "yes" if r_a and r_a >= 1.25 else "no"),
            ("Q0", f"R_A = {r_a} < 1.15", "yes" if r_a and r_a < 1.15 else "no")]
    w = bool(r_b5 and r_b5 >= 1.25 and ex_a and ex_b5 is not None and ex_b5 >= 0.6 * ex_a)
    rows.append(("W", f"R_B5 = {r_b5}, Excess_B5 {ex_b5} ms vs 0.6 x Excess_A {ex_a} ms", "yes" if w else "no"))
    s_ok = bool(r_a and r_a >= 1.25 and ex_a and ex_b5 is not None and ex_b5 < 0.3 * ex_a)
    rows.append(("S", f"Q1 and Excess_B5 {ex_b5} < 0.3 x Excess_A {ex_a}", "yes" if s_ok else "no"))
    pa, pb, pr = c8["profiles"]["A"], c8["profiles"]["B5"], c8["profiles"]["B1p"]
    ref_ok = bool(pr and pr["decode_forward"] > 0.5)
    rows.append(("ref", f"B1p's record caught decode forwards: {pr and pr['decode_forward']} (prefill {pr and pr['extend_forward']})",
                 "usable" if ref_ok else "NOT a decode reference: M1-M3's deltas need one"))
    for name, p in (("A", pa), ("B5", pb)):
        if not p:
            continue
        per_request = p["finish"] + p["stream"] + p["filter"]
        rows.append((f"M1 ({name})", f"finish + stream + filter = {per_request:.1%} of the main thread (upper bound of the Δ "
                     "with no reference)", "no" if per_request < 0.15 else "open"))
        rows.append((f"M3 ({name})", f"sync = {p['sync']:.1%}", "no" if p["sync"] < 0.05 else "open"))
        rows.append((f"M4 ({name})", f"gil = {p['gil']:.1%}", "yes" if p["gil"] >= 0.10 else "no"))
        rows.append((f"M2 ({name})", f"run_batch {p['run_batch']:.1%}, schedule {p['schedule']:.1%}: the step is the "
                     "forward's launch in both A and B5", "not testable without a decode reference"))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", help="write call 4's B1 rounds as a pdo-calibration-raw/1 file here")
    ap.add_argument("--json", help="write the whole read here")
    ap.add_argument("--pyspy-dir", help="write benchmarks/pyspy_summary.py's summary of call 8's three records (the "
                    "scheduler main thread's stacks) as pyspy-<variant>-main.summary.txt")
    ap.add_argument("--result-a", help="write call 4's A summary (its result.json's, as the back-test reads a row) here")
    args = ap.parse_args(argv)
    calls = {c: read_call(c) for c in CALLS}
    for c, r in calls.items():
        print(f"== {c} ({CALLS[c]}): A {r['result_A']}; B1 round medians {r['b1_round_medians']}; records {r['records']}")
        if "main_thread_A" in r:
            print(f"   A's scheduler main thread, ticks/s (100 = a core): {r['main_thread_A']}")
        for k, s in r["summaries"].items():
            print(f"   {k:7s} {json.dumps(s)}")
        for k, p in r["profiles"].items():
            if p:
                print(f"   profile {k}: " + ", ".join(f"{c} {v:.1%}" if c != "samples" else f"{v} samples" for c, v in p.items()))
    print("== eager lines (t, running, step ms, model ms, perturbed by py-spy)")
    for c, r in calls.items():
        for k, lines in r["lines"].items():
            print(f"   {c} {k}: " + " ".join(f"{x['running']}:{x['step_ms']}{'*' if x['perturbed'] else ''}" for x in lines))
    print("== pre-registered tests")
    rows = tests(calls["call4"], calls["call8"])
    for name, value, verdict in rows:
        print(f"   {name:8s} {value}  ->  {verdict}")
    if args.points:
        b1 = json.loads(Tar(LEASE / CALLS["call4"] / "lone-tp1.tar.xz").text(r"lone-b1\.json$") or "{}")["rounds"]
        points = {"schema": "pdo-calibration-raw/1", "source": "scripts/device/eager_lone.py rounds (lone-b1.json), lease 7 call 4",
                  "runs": [{"variant": "lease7-call4-lone-tp1-alone", "decode": [
                      {"batch_size": r["batch"], "context_tokens": 330, "repeat": 0, "step_ms_median": r["step_ms_median"],
                       "client": {k: r["client"][k] for k in ("n", "ok", "wall_s", "input_tokens", "completion_tokens")}}
                      for r in b1]}]}
        Path(args.points).write_text(json.dumps(points, indent=1) + "\n")
    if args.pyspy_dir:
        write_main_thread_profiles(Path(args.pyspy_dir))
    if args.result_a:
        a = calls["call4"]["result_A"]
        Path(args.result_a).write_text(json.dumps({
            "source": f"{CALLS['call4']}/agg-inrun.tar.xz: runs/*/result.json summary (bench's own result)",
            "duration_s": a["duration_s"], "successful_requests": a["successful_requests"],
            "total_tok_s": a["total_throughput"]}, indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"calls": calls, "tests": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
