"""Lease 5 (issue 25, hgpu5): the in-run eager measurement read against its pre-registered outcome table.

Reads only the raw files of benchmarks/results/2026-11-26-two-gpu-lease5-h200x2/ (no model is fitted):
- A: the in-run PD decode's `Decode batch` lines (call 3, pd-inrun.tar.xz): clean eager intervals (graph off, this
  line and the one before with #prealloc-req 0 and #transfer-req 0), step = running / gen tok/s; its GC log
  (SGLANG_LOG_GC=1: every collection's generation and duration) inside the eager stretch;
- B: the lone TP 1 rounds (call 3's lone-tp1 = the pre-registered run, call 5's = a repeat) and the lone TP 2
  rounds (call 5), each round's step as eager_lone.py computed it from the round's own log lines;
- the 1 Hz CPU sampler (cpu-ab.jsonl.xz): over A's eager stretch, steal and busy shares of all CPUs, MHz, the
  decode scheduler (the pid nvidia-smi showed on GPU 1) main thread's busy share, every thread above 20 % of a core
  and which CPUs they ran on; over each lone round, the lone scheduler's main thread.
Then each pre-registered test (README of 2026-11-26-eager-inrun-predicted) against the predictions in --predicted
(eager_inrun_predict.py's JSON for the GPU the lease came as). --points writes the lone rounds as a
`pdo-calibration-raw/1` file (client wall per round) for the back-test's point rows.

Usage: .venv/bin/python benchmarks/eager_inrun_read.py --predicted P.json [--points OUT.json]
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import statistics
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.calibrate.logparse import decode_lines  # noqa: E402

LEASE = ROOT / "benchmarks/results/2026-11-26-two-gpu-lease5-h200x2"
GC_END = re.compile(r"GC end: Time ([\d.]+) \| Generation (\d) \| Duration: ([\d.]+)s")
GPU1_BUS = "00000000:00:07.0"   # GPU 1 on the lent machine (call1-site-part00/env-machine.txt)


def member(tarball: Path, suffix: str) -> str:
    with tarfile.open(tarball) as tar:
        name = next(n for n in tar.getnames() if n.endswith(suffix))
        data = tar.extractfile(name)
        assert data is not None, name
        return data.read().decode(errors="replace")


def inrun_lines(log: str) -> list[dict]:
    rows = [r for r in decode_lines(log) if r["ranks"] in ("", "TP0")]
    out = []
    prevs: list[dict | None] = [None, *rows[:-1]]
    for prev, r in zip(prevs, rows):
        quiet = lambda x: x is not None and x.get("prealloc") == 0 and x.get("transfer") == 0   # noqa: E731
        out.append({**r, "step_ms": 1e3 * r["running"] / r["gen_tok_s"] if r["gen_tok_s"] > 0 else None,
                    "clean": not r["cuda_graph"] and quiet(r) and quiet(prev)})
    return out


def gc_in(log: str, t0: float, t1: float) -> dict:
    by_gen: dict[str, list[float]] = defaultdict(list)
    for t, gen, dur in GC_END.findall(log):
        if t0 <= float(t) <= t1:
            by_gen[gen].append(float(dur))
    return {g: {"count": len(v), "seconds": round(sum(v), 4), "max_s": round(max(v), 4)} for g, v in sorted(by_gen.items())}


def sampler(path: Path) -> tuple[dict, list[dict], list[dict]]:
    lines = [json.loads(x) for x in lzma.open(path, "rt")]
    return (next(x for x in lines if x["kind"] == "host"), [x for x in lines if x["kind"] == "sample"],
            [x for x in lines if x["kind"] == "gpu"])


def window(samples: list[dict], t0: float, t1: float) -> tuple[list[dict], float]:
    """Samples whose interval ends inside [t0, t1] and the seconds they cover."""
    win, seconds = [], 0.0
    for prev, s in zip(samples, samples[1:]):
        if t0 <= s["t"] <= t1:
            win.append(s)
            seconds += s["t"] - prev["t"]
    return win, seconds


def thread_shares(win: list[dict], seconds: float, hz: int) -> dict:
    ticks: dict[tuple, float] = defaultdict(float)
    cpus: dict[tuple, set] = defaultdict(set)
    for s in win:
        for pid, tid, comm, d, last in s["threads"]:
            ticks[(pid, tid, comm)] += d
            cpus[(pid, tid, comm)].add(last)
    return {k: (v / (seconds * hz), sorted(cpus[k])) for k, v in ticks.items()}


def cpu_shares(win: list[dict], fields: list[str]) -> dict:
    tot = [0] * len(fields)
    for s in win:
        tot = [a + b for a, b in zip(tot, s["cpu"]["cpu"])]
    all_ticks = sum(tot) or 1
    named = dict(zip(fields, tot))
    return {"steal": named["steal"] / all_ticks, "busy": 1 - (named["idle"] + named["iowait"]) / all_ticks,
            "mhz": sorted({m for s in win for m in s["mhz"]})}


def interp(points: dict[int, float], batch: float) -> float:
    xs = sorted(points)
    if batch <= xs[0]:
        return points[xs[0]]
    if batch >= xs[-1]:
        return points[xs[-1]]
    for a, b in zip(xs, xs[1:]):
        if a <= batch <= b:
            return points[a] + (points[b] - points[a]) * (batch - a) / (b - a)
    raise AssertionError(batch)


def rounds(path: Path) -> list[dict]:
    return json.loads(path.read_text())["rounds"]


def steps(rs: list[dict], variant: str) -> dict[int, float]:
    return {r["batch"]: r["step_ms_median"] for r in rs if r["variant"] == variant and r["step_ms_median"]}


def lone_json(call: str, name: str) -> Path:
    out = Path("/tmp") / f"lease5-{call}-{name}.json"
    out.write_text(member(LEASE / call / f"{name}.tar.xz", f"{name}/lone.json"))
    return out


def calibration_points(runs: dict[str, list[dict]]) -> dict:
    """The lone rounds as a pdo-calibration-raw/1 file: one run per (server, variant, call), a decode point per batch
    (context = the prompt length; client wall from the first send to the last answer, prefill included)."""
    out = []
    for name, rs in runs.items():
        for variant in sorted({r["variant"] for r in rs}):
            out.append({"variant": f"{name}-{variant}", "decode": [
                {"batch_size": r["batch"], "context_tokens": 330, "repeat": 0, "step_ms_median": r["step_ms_median"],
                 "client": {k: r["client"][k] for k in ("n", "ok", "wall_s", "input_tokens", "completion_tokens")}}
                for r in rs if r["variant"] == variant]})
    return {"schema": "pdo-calibration-raw/1", "source": "scripts/device/eager_lone.py rounds (lone.json), lease 5",
            "runs": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--predicted", required=True, help="eager_inrun_predict.py --json output for the lease's GPU")
    ap.add_argument("--points", help="write the lone rounds as a pdo-calibration-raw/1 file here")
    args = ap.parse_args(argv)
    pred = json.loads(Path(args.predicted).read_text())
    model_tp1 = {r["batch"]: r["step_ms"] for r in pred["lone TP 1 (B1-B4)"]["rows"]}
    model_tp2 = {r["batch"]: r["step_ms"] for r in pred["lone TP 2 (item 2)"]["rows"]}

    log = member(LEASE / "call3-eager-ab/pd-inrun.tar.xz", "decode-0-0.log")
    lines = inrun_lines(log)
    eager = [x for x in lines if not x["cuda_graph"]]
    t0, t1 = eager[0]["t"], eager[-1]["t"]
    clean = [x for x in lines if x["clean"]]
    print(f"== A: in-run PD decode (GPU 1, mem 0.65, graphs to 256), eager lines {len(eager)}, clean {len(clean)}, "
          f"stretch {t1 - t0:.0f} s")
    print("    s  running  step ms  clean")
    for x in eager:
        print(f"  {x['t'] - t0:4.0f}  {x['running']:7d}  {x['step_ms']:7.1f}  {'yes' if x['clean'] else 'no'}")

    b1 = rounds(lone_json("call3-eager-ab", "lone-tp1"))
    b1r = rounds(lone_json("call5-tp2-b-repeat", "lone-tp1"))
    tp2 = rounds(lone_json("call5-tp2-b-repeat", "lone-tp2"))
    print("\n== B: lone TP 1 on GPU 1, step ms (median of the round's lines); model = the planner's")
    print("  variant          " + "  ".join(f"B={b:>4}" for b in (300, 450, 600)))
    print("  model            " + "  ".join(f"{model_tp1[b]:6.1f}" for b in (300, 450, 600)))
    for label, rs in (("call 3", b1), ("call 5 repeat", b1r)):
        for v in ("alone", "stream", "spin", "pinned"):
            s = steps(rs, v)
            print(f"  {v:7s} {label:9s}" + "  ".join(f"{s[b]:6.1f}" if b in s else "     -" for b in (300, 450, 600)))
    s2 = steps(tp2, "alone")
    print(f"\n== lone TP 2 over both GPUs, alone: B=300 {s2.get(300)} ms, B=600 {s2.get(600)} ms "
          f"(model {model_tp2[300]} / {model_tp2[600]})")

    ratios = {label: [x["step_ms"] / interp(steps(rs, "alone"), x["running"]) for x in clean]
              for label, rs in (("call 3", b1), ("call 5 repeat", b1r))}
    gc = gc_in(log, t0 - 1, t1 + 1)
    gc_s = sum(g["seconds"] for g in gc.values())
    gen2 = gc.get("2", {}).get("seconds", 0.0)

    host, samples, gpus = sampler(LEASE / "call3-eager-ab/cpu-ab.jsonl.xz")
    hz = host["clk_tck"]
    on_gpu1 = sorted({int(a.split(",")[0]) for g in gpus if t0 - 300 <= g["t"] <= t1 + 60 for a in g["apps"]
                      if GPU1_BUS in a})
    decode_pid = on_gpu1[0]
    win, seconds = window(samples, t0, t1 + 1)
    shares = thread_shares(win, seconds, hz)
    cpu = cpu_shares(win, host["stat_fields"])
    main_busy = shares.get((decode_pid, decode_pid, "sglang::schedul"), (0.0, []))
    print(f"\n== sampler over A's eager stretch: {len(win)} samples, {seconds:.1f} s; {host['nproc']} CPUs, "
          f"SMT siblings per CPU: {sorted({len(v.split(',')) for v in host['siblings'].values()})}; "
          f"steal {100 * cpu['steal']:.2f} %, all CPUs busy {100 * cpu['busy']:.1f} %, MHz seen {cpu['mhz']}")
    print(f"  decode scheduler (pid {decode_pid}, GPU 1) main thread busy {100 * main_busy[0]:.0f} % on CPUs {main_busy[1]}")
    print("  threads above 20 % of a core: pid tid comm busy% CPUs")
    busy_threads = sorted(((k, v) for k, v in shares.items() if v[0] > 0.2), key=lambda kv: -kv[1][0])
    for (pid, tid, comm), (share, cpus) in busy_threads:
        print(f"    {pid:6d} {tid:6d} {comm:16s} {100 * share:5.0f}  {cpus}")
    same_cpu = [k for k, v in busy_threads if k != (decode_pid, decode_pid, "sglang::schedul") and set(v[1]) & set(main_busy[1])]
    print(f"  busy threads that ran on the decode main thread's CPU(s): {same_cpu or 'none'}")
    for label, rs in (("call 3", b1),):
        for r in rs:
            w, sec = window(samples, r["t0"] + 1, r["t1"])
            sh = thread_shares(w, sec, hz) if sec else {}
            top = max((v[0] for k, v in sh.items() if k[2] == "sglang::schedul"), default=0.0)
            print(f"  lone {label} {r['variant']:7s} B={r['batch']}: busiest scheduler thread {100 * top:.0f} %")

    print("\n== pre-registered tests")
    b1s = steps(b1, "alone")
    within = {b: b1s[b] / model_tp1[b] - 1 for b in (300, 450, 600)}
    med = {k: statistics.median(v) for k, v in ratios.items()}
    print("  O1  B1 vs model: " + ", ".join(f"{b}: {100 * e:+.0f} %" for b, e in within.items())
          + f" (within ±15 %: {all(abs(e) <= 0.15 for e in within.values())}); A / B1 at equal batch, median over "
          f"{len(clean)} clean lines: call 3 x{med['call 3']:.2f}, repeat x{med['call 5 repeat']:.2f} (>= 1.3: "
          f"{med['call 3'] >= 1.3})")
    for label, rs in (("call 3", b1), ("call 5 repeat", b1r)):
        a, s, p, st = (steps(rs, v) for v in ("alone", "stream", "spin", "pinned"))
        b3 = statistics.median(s_ / a[b] for b, s_ in p.items() if b in a) if p else float("nan")
        b4 = statistics.median(v / a[b] - 1 for b, v in st.items() if b in a) if st else float("nan")
        b2 = statistics.median(1e3 * (v - a[b]) / b for b, v in s.items() if b in a)
        print(f"  {label}: O2 B3 / B1 median x{b3:.2f} (>= 1.25: {b3 >= 1.25}); B4 vs B1 {100 * b4:+.0f} %; "
              f"O4 (B2 - B1) / batch median {b2:.1f} us per request (>= 20: {b2 >= 20})")
    print(f"  O3  steal {100 * cpu['steal']:.2f} % of A's eager-stretch ticks (> 5 %: {cpu['steal'] > 0.05}); "
          "SMT siblings: none on this host (1 thread per core), so no sibling co-runner")
    print(f"  O5  A's GC inside the eager stretch: {json.dumps(gc)}; all generations {gc_s:.3f} s = "
          f"{100 * gc_s / (t1 - t0):.1f} % of {t1 - t0:.0f} s, gen 2 {100 * gen2 / (t1 - t0):.1f} % (>= 10 %: {gen2 >= 0.1 * (t1 - t0)})")
    print(f"  O6  decode scheduler main thread busy {100 * main_busy[0]:.0f} % (< 90 %: {main_busy[0] < 0.9}; a CUDA "
          "sync spins, so busy does not tell launch work from waiting)")
    t2 = {b: s2[b] / model_tp2[b] - 1 for b in s2}
    print("  T2  lone TP 2 vs model: " + ", ".join(f"{b}: {100 * e:+.0f} %" for b, e in t2.items())
          + f"; in 87-93 ms: {all(87 <= v <= 93 for v in s2.values())}")
    if args.points:
        Path(args.points).write_text(json.dumps(calibration_points(
            {"lone-tp1-call3": b1, "lone-tp1-call5": b1r, "lone-tp2-call5": tp2}), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
