"""The read of the mem-fraction A/B (issue 25, heager): does the decoding server's mem_fraction_static set the eager
decode step's in-run price on one host? As pre-registered in benchmarks/results/2026-11-28-eager-memfrac-predicted/.

From the call's `memfrac.tar.xz` (scripts/device/eager_memfrac.sh ab): `events.jsonl` (each round's server start,
begin and end), `steps-r<k>.jsonl` (the step probe of round k's own server), `launch-r<k>.jsonl` (launch_probe.py on
another vCPU), `r<k>.log` (the server log: a CUDA OOM names A-OOM), `gpu.csv`. Steps read as lease 10's
(benchmarks/lease10_read.py): decode steps with >= 540 running inside the round, the first 3 and the re-anchoring
steps left out; L = the iteration; fast L <= 80 ms, slow L >= 88 ms. The price = mean L / the planner's 60.55 ms.

Usage: .venv/bin/python benchmarks/eager_memfrac_read.py ARCHIVE_DIR [--json OUT]
  (ARCHIVE_DIR holds memfrac.tar.xz: benchmarks/results/2026-11-28-eager-memfrac-h100/call4-ab)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.eager_host_read import spearman
from benchmarks.lease10_read import FAST_MS, SLOW_MS, jsonl, med, members, near, rounds, steps_of

PLANNER_STEP_MS = 60.55   # predicted.txt: the planner's eager step at batch 600, both arms (launch-bound)
MIN_STEPS, MARGIN, MIN_SLOW = 100, 1.15, 20
OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")


def round_read(rnd: dict, lines: list[dict], probe: list[dict], log: str) -> dict:
    """One round: its read steps' L, price, slow share, per-step CPU / GPU / allocator medians and the launch probe
    over the round's read stretch."""
    st = steps_of(lines, rnd)
    ls = [s["L"] for s in st]
    span = [x for x in probe if st and st[0]["t0"] <= x["t"] <= st[-1]["t0"]]
    mean_l = statistics.fmean(ls) if ls else None
    return {"k": rnd["k"], "arm": rnd["name"], "steps": len(st), "median_L": med(ls),
            "mean_L": round(mean_l, 2) if mean_l is not None else None,
            "price": round(mean_l / PLANNER_STEP_MS, 3) if mean_l is not None else None,
            "median_price": round(statistics.median(ls) / PLANNER_STEP_MS, 3) if ls else None,
            "slow_share": round(sum(x >= SLOW_MS for x in ls) / len(ls), 3) if ls else None,
            "cpu": med([s["cpu"] for s in st]), "gpu": med([s["gpu"] for s in st]), "g1": med([s["g1"] for s in st]),
            "alloc_share": round(sum(s["mem"] > 0 for s in st) / len(st), 3) if st else None,
            "common_cpu": statistics.mode([s["c0"] for s in st]) if st else None,
            "probe_launch_us": med([x["launch_us"] for x in span]), "probe_loop_cpu_ms": med([x["loop_cpu_ms"] for x in span]),
            "probe_ticks": len(span), "oom": bool(OOM.search(log))}


def rule(read: list[dict]) -> str:
    """The pre-registered outcome, first that holds."""
    if any(r["oom"] and r["arm"] == "A" for r in read):
        return "A-OOM: an A server died of CUDA OOM; that pair is not read"
    counted = [r for r in read if r["steps"] >= MIN_STEPS]
    a = [r["price"] for r in counted if r["arm"] == "A"]
    b = [r["price"] for r in counted if r["arm"] == "B"]
    if len(a) < 2 or len(b) < 2:
        return f"INCOMPLETE: {len(a)} A and {len(b)} B rounds with >= {MIN_STEPS} read steps"
    a1, a2, b1, b2 = a[0], a[1], b[0], b[1]
    spread = max(abs(a1 - a2), abs(b1 - b2))
    if min(b) - max(a) > spread and min(b) >= MARGIN * max(a):
        return "MEM explains: both B rounds above both A rounds, by more than the spread and >= x1.15"
    if min(a) - max(b) > spread and min(a) >= MARGIN * max(b):
        return "MEM inverted: both A rounds above both B rounds, by more than the spread and >= x1.15"
    up = a2 / a1 >= MARGIN and b2 / b1 >= MARGIN
    down = a2 / a1 <= 1 / MARGIN and b2 / b1 <= 1 / MARGIN
    if up or down:
        return f"TIME drift: both later rounds {'slower' if up else 'faster'} than their arm's first by >= x1.15"
    return "NOT EXPLAINED: the fraction does not order the rounds' prices, nor does time"


def probe_read(steps: list[dict], probe: list[dict]) -> dict:
    """The other vCPU's launch path and loop at the scheduler's slow steps against its fast ones, pooled."""
    def at(group: list[dict]) -> list[dict]:
        return [x for s in group if (x := near(probe, s["t0"] + s["L"] / 2e3, within_s=0.1)) is not None]

    slow = at([s for s in steps if s["L"] >= SLOW_MS])
    fast = at([s for s in steps if s["L"] <= FAST_MS])
    out: dict = {"slow_ticks": len(slow), "fast_ticks": len(fast),
                 "launch_us_slow": med([x["launch_us"] for x in slow]), "launch_us_fast": med([x["launch_us"] for x in fast]),
                 "loop_cpu_ms_slow": med([x["loop_cpu_ms"] for x in slow]),
                 "loop_cpu_ms_fast": med([x["loop_cpu_ms"] for x in fast])}
    bl: dict[int, list[float]] = {}
    bp: dict[int, list[float]] = {}
    for s in steps:
        bl.setdefault(int(s["t0"]), []).append(s["L"])
    for x in probe:
        bp.setdefault(int(x["t"]), []).append(x["launch_us"])
    keys = [k for k in bl if k in bp and len(bl[k]) >= 5]
    rho = spearman([statistics.median(bl[k]) for k in keys], [statistics.median(bp[k]) for k in keys]) \
        if len(keys) >= 3 else None
    out["spearman_1s"] = round(rho, 3) if rho is not None else None
    if len([s for s in steps if s["L"] >= SLOW_MS]) < MIN_SLOW or not slow or not fast:
        out["outcome"] = f"not read: fewer than {MIN_SLOW} slow read steps (or no probe tick beside them)"
        return out
    launch = out["launch_us_slow"] >= MARGIN * out["launch_us_fast"]
    loop = out["loop_cpu_ms_slow"] >= MARGIN * out["loop_cpu_ms_fast"]
    out["outcome"] = ("HOST-WIDE: the other vCPU's launches and loop slow too" if launch and loop else
                      "LAUNCH PATH: the other vCPU's launches slow, its loop not" if launch else
                      "PER-VCPU: the other vCPU's launches and loop unslowed")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archive_dir")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    d = Path(args.archive_dir)
    if not (d / "memfrac.tar.xz").is_file():
        ap.error(f"archive_dir: {d}/memfrac.tar.xz not found (the ab call's folder, e.g. "
                 "benchmarks/results/2026-11-28-eager-memfrac-h100/call4-ab)")
    files = members(d / "memfrac.tar.xz")
    events = jsonl(files.get("events.jsonl", b""))
    read, pooled, probes = [], [], []
    for rnd in sorted(rounds(events), key=lambda r: r["k"]):
        name = f"r{rnd['k']}"
        lines = jsonl(files.get(f"steps-{name}.jsonl", b""))
        probe = [x for x in jsonl(files.get(f"launch-{name}.jsonl", b"")) if "t" in x]
        r = round_read(rnd, lines, probe, files.get(f"{name}.log", b"").decode(errors="replace"))
        info = json.loads(files[f"{name}.json"]) if f"{name}.json" in files else {}
        r["ready_after_s"] = round(info["ready_after_s"], 1) if "ready_after_s" in info else None
        read.append(r)
        pooled += steps_of(lines, rnd)
        probes += probe
    skipped = [e["event"] for e in events if "skipped" in e["event"] or "not ready" in e["event"]]
    p = probe_read(pooled, probes)
    result = {"rounds": read, "skipped": skipped, "outcome": rule(read), "probe": p}
    print(f"mem-fraction A/B read: {len(read)} rounds; steps >= 540 running, first 3 left out; fast L <= {FAST_MS} ms, "
          f"slow L >= {SLOW_MS} ms; price = mean L / {PLANNER_STEP_MS} ms (the planner's step at batch 600)")
    cols = ("k", "arm", "ready_after_s", "steps", "median_L", "mean_L", "price", "median_price", "slow_share", "cpu",
            "gpu", "g1", "alloc_share", "common_cpu", "probe_launch_us", "probe_loop_cpu_ms", "probe_ticks", "oom")
    print(" ".join(f"{c:>13}" for c in cols))
    for r in read:
        print(" ".join(f"{str(r[c]):>13}" for c in cols))
    for s in skipped:
        print(f"event: {s}")
    print(f"outcome: {result['outcome']}")
    print(f"launch probe (pooled; {p['slow_ticks']} ticks at slow steps, {p['fast_ticks']} at fast): launch "
          f"{p['launch_us_slow']} / {p['launch_us_fast']} us, loop CPU {p['loop_cpu_ms_slow']} / {p['loop_cpu_ms_fast']} ms "
          f"(slow / fast); Spearman of L and launch us over 1 s bins {p['spearman_1s']}")
    print(f"probe outcome: {p['outcome']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
