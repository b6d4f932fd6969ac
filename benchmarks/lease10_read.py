"""The read of lease 10 (issue 25, hgpu10): what the slow eager decode steps are made of, as pre-registered in
benchmarks/results/2026-11-27-lease10-predicted/README.md, and the opening burst streamed straight to the server.

From the call's `lone10.tar.xz` (scripts/device/eager_modes.sh lone): `steps.jsonl` (the step probe's line per
scheduler step), `events.jsonl` (round begin / end), `gpu.csv` (nvidia-smi every 100 ms), `vcpu.jsonl` (the fixed
loop at 10 Hz), `burst.json` (replay.py --stream), `nstat-*.txt`, and the call's `host.txt` (numactl -H).

Steps read: decode steps with >= 540 running inside a round, the first 3 of each round and the re-anchoring steps
left out. A step's length L is its iteration (its run_batch start to the next one's: the next line's `per`; that
line's rq / gc / mem / it_cpu cover the same iteration). Fast: L <= 80 ms; slow: L >= 88 ms (fixed before the lease).

Usage: .venv/bin/python benchmarks/lease10_read.py ARCHIVE_DIR [--json OUT]
  (ARCHIVE_DIR holds lone10.tar.xz and host.txt: benchmarks/results/2026-11-27-lease10-h100/call4-lone)
"""

from __future__ import annotations

import argparse
import bisect
import csv
import io
import json
import lzma
import re
import statistics
import sys
import tarfile
from datetime import datetime, timezone
from pathlib import Path

FAST_MS, SLOW_MS, MIN_RUNNING, SKIP_FIRST = 80.0, 88.0, 540, 3


def members(archive: Path) -> dict[str, bytes]:
    """The archive's files by base name (lone10/steps.jsonl -> steps.jsonl)."""
    out = {}
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isfile() else None
            if f is not None:
                out[Path(m.name).name] = f.read()
    return out


def jsonl(data: bytes) -> list[dict]:
    rows = []
    for line in data.decode(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue   # a line cut when the server stopped
    return rows


def rounds(events: list[dict]) -> list[dict]:
    """[{k, name, t0, t1}] from the script's 'round k NAME begins / ends' events."""
    begun: dict[str, dict] = {}
    for e in events:
        m = re.match(r"round (\d+) (\w+) (begins|ends)", e["event"])
        if m:
            r = begun.setdefault(m[1], {"k": int(m[1]), "name": m[2]})
            r["t0" if m[3] == "begins" else "t1"] = e["t"]
    return [r for r in begun.values() if "t0" in r and "t1" in r]


def steps_of(lines: list[dict], rnd: dict) -> list[dict]:
    """The round's read steps, each with its iteration's fields from the next line."""
    by_i = {x["i"]: x for x in lines if "i" in x}
    inside = [x for x in lines if "i" in x and x["m"] == "d" and x["bs"] >= MIN_RUNNING
              and rnd["t0"] <= x["t0"] <= rnd["t1"]]
    out = []
    for x in inside[SKIP_FIRST:]:
        nxt = by_i.get(x["i"] + 1)
        if x.get("anc") or nxt is None or "per" not in nxt or "g1" not in x:
            continue
        out.append({"t0": x["t0"], "L": nxt["per"], "wall": x["wall"], "cpu": x["cpu"], "gpu": x["gpu"],
                    "g1": x["g1"], "c0": x["c0"], "c1": x["c1"], "rq": nxt["rq"], "it_cpu": nxt["it_cpu"],
                    "gc2_ms": nxt["gc"][5], "gc_ms": sum(nxt["gc"][3:]), "mem": sum(nxt.get("mem", [0, 0, 0])),
                    "bs": x["bs"]})
    return out


def med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 2) if xs else None


def numa_of(host: str) -> dict[int, int]:
    """CPU -> NUMA node from `numactl -H` (empty when numactl was absent)."""
    out = {}
    for m in re.finditer(r"node (\d+) cpus:([\d ]*)", host):
        for c in m[2].split():
            out[int(c)] = int(m[1])
    return out


def gpu_samples(data: bytes) -> list[dict]:
    """nvidia-smi's CSV: epoch t, sm / mem MHz, W, C, throttle reasons (hex), util %."""
    rows = []
    reader = csv.reader(io.StringIO(data.decode(errors="replace")))
    for row in reader:
        if len(row) < 7 or row[0].startswith("timestamp"):
            continue
        try:
            t = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp()
            num = [float(re.sub(r"[^\d.]", "", v) or "nan") for v in row[1:5]]
        except ValueError:
            continue
        rows.append({"t": t, "sm": num[0], "mem": num[1], "w": num[2], "temp": num[3], "reasons": row[5].strip(),
                     "util": row[6].strip()})
    return rows


def near(samples: list[dict], t: float, key: str = "t", within_s: float = 0.15) -> dict | None:
    best = min(samples, key=lambda s: abs(s[key] - t), default=None)
    return best if best is not None and abs(best[key] - t) <= within_s else None


def summarise(steps: list[dict], numa: dict[int, int], gpu: list[dict], vcpu: list[dict]) -> dict:
    """Slow and fast steps' medians of each field, and the sub-case tests of the pre-registration."""
    slow = [s for s in steps if s["L"] >= SLOW_MS]
    fast = [s for s in steps if s["L"] <= FAST_MS]

    def side(group: list[dict]) -> dict:
        cpus = [s["c0"] for s in group]
        common = statistics.mode(cpus) if cpus else None
        g = [x for s in group if (x := near(gpu, s["t0"])) is not None]
        v = [x for s in group if (x := near(vcpu, s["t0"] + s["L"] / 2e3, within_s=0.1)) is not None]
        return {"n": len(group), **{k: med([s[k] for s in group]) for k in
                                    ("L", "wall", "cpu", "gpu", "g1", "rq", "it_cpu", "gc2_ms", "gc_ms")},
                "migrated_share": round(sum(s["c0"] != s["c1"] for s in group) / len(group), 3) if group else None,
                "common_cpu": common, "numa": numa.get(common) if common is not None else None,
                "alloc_share": round(sum(s["mem"] > 0 for s in group) / len(group), 3) if group else None,
                "sm_mhz": med([x["sm"] for x in g]), "power_w": med([x["w"] for x in g]),
                "reasons": sorted({x["reasons"] for x in g}), "vcpu_cpu_ms": med([x["cpu_ms"] for x in v]),
                "vcpu_wall_ms": med([x["wall_ms"] for x in v])}

    return {"steps": len(steps), "slow_share": round(len(slow) / len(steps), 3) if steps else None,
            "mean_L": round(statistics.fmean(s["L"] for s in steps), 2) if steps else None,
            "slow": side(slow), "fast": side(fast)}


IDLE_REASONS = {"0x0000000000000000", "0x0000000000000001"}


def outcome(s: dict, shares: list[float]) -> str:
    """The pre-registered outcome, first that holds."""
    if not shares or max(shares) < 0.05:
        return "N: no slow mode"
    sl, fa = s["slow"], s["fast"]
    if sl["n"] == 0 or fa["n"] == 0:
        return "N: no slow mode"
    gpu_ratio = (sl["gpu"] or 0) / fa["gpu"] if fa["gpu"] else 0
    if (sl["g1"] >= 10 and fa["g1"] < 5) or (gpu_ratio >= 1.3 and sl["g1"] > fa["g1"]):
        clock = (sl["sm_mhz"] and fa["sm_mhz"] and sl["sm_mhz"] <= 0.9 * fa["sm_mhz"]) or \
            bool(set(sl["reasons"]) - IDLE_REASONS)
        return "G-clock: the GPU, at lower clocks or throttled" if clock else "G-work: the GPU, slower at the same clocks"
    if not (sl["g1"] < 5 and fa["g1"] < 5):
        return "unclassified: g1 between the G and C signatures"
    if sl["rq"] >= 10:
        return "C-rq: the scheduler thread waits for a CPU"
    if sl["migrated_share"] >= 0.2 or sl["common_cpu"] != fa["common_cpu"] or sl["numa"] != fa["numa"]:
        return "C-mig: migration / placement"
    if sl["gc2_ms"] >= 0.5 * (sl["L"] - fa["L"]):
        return "C-gc: Python GC"
    if sl["alloc_share"] >= 0.5 and fa["alloc_share"] < 0.05:
        return "C-alloc: the CUDA caching allocator"
    if sl["vcpu_cpu_ms"] and fa["vcpu_cpu_ms"] and sl["vcpu_cpu_ms"] >= 1.15 * fa["vcpu_cpu_ms"]:
        return "C-host: the host slows the vCPUs"
    if sl["cpu"] >= 1.3 * fa["cpu"]:
        return "C-core: the scheduler's own vCPU or more driver work per launch (not separable)"
    return "C, no sub-case holds"


def burst_read(files: dict[str, bytes], lines: list[dict]) -> dict | None:
    if "burst.json" not in files:
        return None
    b = json.loads(files["burst.json"])
    t_start = b["summary"]["start_epoch_s"]
    ext = [x for x in lines if "i" in x and x["m"] == "e" and x["t0"] >= t_start]
    ok = [r for r in b["results"] if r.get("ok") and r.get("first_s") is not None]
    firsts = sorted(r["first_s"] for r in ok)
    served = 0
    flood = []
    for x in ext[:60]:
        served += x["bs"]
        flood.append((round(x["t0"] - t_start, 3), round(x["wall"], 1), served))
    out = {"completed": b["summary"]["completed"], "last_sent_s": b["summary"].get("last_sent_s"),
           "first_prefill_start_s": flood[0][0] if flood else None,
           "S_first_prefill_end_s": round(ext[0]["t0"] + ext[0]["wall"] / 1e3 - t_start, 3) if ext else None,
           "F_first_chunk_s": round(firsts[0], 3) if firsts else None,
           "M_median_first_chunk_s": round(firsts[len(firsts) // 2], 3) if firsts else None,
           "last_first_chunk_s": round(firsts[-1], 3) if firsts else None,
           "first_chunks_within_50ms_of_F": sum(f <= firsts[0] + 0.05 for f in firsts) if firsts else 0,
           "prefill_steps": flood[:12]}
    gap = out["F_first_chunk_s"] - out["S_first_prefill_end_s"] if firsts and ext else None
    out["verdict"] = ("no data" if gap is None else "no step without our router" if gap <= 0.2
                      else "a step without our router" if gap >= 0.8 else f"inconclusive (F - S = {gap:.2f} s)")
    for name in ("nstat-before.txt", "nstat-after.txt"):
        out[name] = listen_counters(files.get(name, b"").decode(errors="replace"))
    return out


def listen_counters(text: str) -> dict[str, int]:
    """TcpExt ListenOverflows / ListenDrops from `nstat` lines or /proc/net/netstat's header + values line pair."""
    found = {k.removeprefix("TcpExt"): int(v) for k, v in re.findall(r"(TcpExtListen(?:Overflows|Drops))\s+(\d+)", text)}
    lines = text.splitlines()
    for head, vals in zip(lines, lines[1:]):
        if head.startswith("TcpExt:") and vals.startswith("TcpExt:") and not vals.split()[1].isalpha():
            row = dict(zip(head.split()[1:], vals.split()[1:]))
            found.update({k: int(row[k]) for k in ("ListenOverflows", "ListenDrops") if k in row})
    return found


def second_bins_r(steps: list[dict], vcpu: list[dict]) -> float | None:
    """Pearson r over 1 s bins between the steps' median L and the vCPU probe's median CPU ms (bins with >= 5
    steps): does the probe on another CPU slow when the scheduler does?"""
    bl: dict[int, list[float]] = {}
    bv: dict[int, list[float]] = {}
    for x in steps:
        bl.setdefault(int(x["t0"]), []).append(x["L"])
    for x in vcpu:
        bv.setdefault(int(x["t"]), []).append(x["cpu_ms"])
    keys = [k for k in bl if k in bv and len(bl[k]) >= 5]
    if len(keys) < 3:
        return None
    a = [statistics.median(bl[k]) for k in keys]
    b = [statistics.median(bv[k]) for k in keys]
    return round(statistics.correlation(a, b), 3)


def probe_context(steps: list[dict], vcpu: list[dict]) -> dict:
    """The vCPU probe on its own: its spread, its median while the scheduler steps and while it idles (no step
    within 0.3 s), its steal ticks, and around each slow stretch (>= 3 slow steps in a row) against the 5 s before
    and after."""
    ts = sorted(x["t0"] for x in steps)

    def busy(t: float) -> bool:
        i = bisect.bisect_right(ts, t)
        return i > 0 and t - ts[i - 1] < 0.3

    def window(a: float, b: float) -> float | None:
        return med([x["cpu_ms"] for x in vcpu if a <= x["t"] < b])

    cpu = sorted(x["cpu_ms"] for x in vcpu)
    runs: list[list] = []
    for s in sorted(steps, key=lambda x: x["t0"]):
        slow = s["L"] >= SLOW_MS
        if runs and runs[-1][0] == slow:
            runs[-1][2], runs[-1][3] = s["t0"], runs[-1][3] + 1
        else:
            runs.append([slow, s["t0"], s["t0"], 1])
    stretches = sorted((r for r in runs if r[0] and r[3] >= 3), key=lambda r: -r[3])
    return {"quantiles_5_50_95": [round(cpu[int(q * (len(cpu) - 1))], 2) for q in (0.05, 0.5, 0.95)] if cpu else None,
            "median_busy": med([x["cpu_ms"] for x in vcpu if busy(x["t"])]),
            "median_idle_after_first_step": med([x["cpu_ms"] for x in vcpu if ts and x["t"] > ts[0] and not busy(x["t"])]),
            "steal_ticks": sum(x.get("steal", 0) for x in vcpu),
            "slow_stretches": len(stretches), "single_or_pair_slow_steps": sum(r[3] for r in runs if r[0] and r[3] < 3),
            "longest": [{"steps": r[3], "s": round(r[2] - r[1], 2), "probe_in": window(r[1], r[2]),
                         "before": window(r[1] - 5, r[1]), "after": window(r[2], r[2] + 5)} for r in stretches[:4]]}


def guest_cpu(path: Path, steps: list[dict]) -> dict | None:
    """From cpu_sampler.py's 1 Hz lines: the guest's busy ticks per second (all CPUs, the scheduler's process, steal)
    in seconds whose steps were mostly slow (>= half) against seconds with none slow (>= 5 steps each)."""
    if not path.is_file():
        return None
    rows = [json.loads(x) for x in lzma.open(path, "rt")]
    ts = sorted((x["t0"], x["L"]) for x in steps)
    keys = [t for t, _ in ts]
    out: dict[str, list] = {"slow": [], "fast": []}
    for r in (x for x in rows if x.get("kind") == "sample"):
        a, b = bisect.bisect_left(keys, r["t"] - 1), bisect.bisect_left(keys, r["t"])
        ls = [L for _, L in ts[a:b]]
        if len(ls) < 5:
            continue
        frac = sum(L >= SLOW_MS for L in ls) / len(ls)
        side = "slow" if frac >= 0.5 else "fast" if frac == 0 else None
        if side:
            cpus = [v for k, v in r["cpu"].items() if k != "cpu"]
            top = max(r["threads"], key=lambda t: t[3], default=[0, 0, "", 0, 0])
            out[side].append((sum(v[0] + v[1] + v[2] + v[5] + v[6] for v in cpus), sum(v[7] for v in cpus), top[3],
                              r["mhz"][0] if r.get("mhz") else None))
    return {side: {"seconds": len(v), "all_cpus_busy_ticks": med([x[0] for x in v]),
                   "steal_ticks": med([x[1] for x in v]), "busiest_thread_ticks": med([x[2] for x in v]),
                   "mhz_seen": sorted({x[3] for x in v})} for side, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("archive_dir")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    d = Path(args.archive_dir)
    if not (d / "lone10.tar.xz").is_file():
        ap.error(f"archive_dir: {d}/lone10.tar.xz not found (the lone call's folder, e.g. "
                 "benchmarks/results/2026-11-27-lease10-h100/call4-lone)")
    files = members(d / "lone10.tar.xz")
    host = (d / "host.txt").read_text(errors="replace") if (d / "host.txt").is_file() else ""
    lines = jsonl(files.get("steps.jsonl", b""))
    gpu = gpu_samples(files.get("gpu.csv", b""))
    vcpu = [x for x in jsonl(files.get("vcpu.jsonl", b"")) if "t" in x]
    numa = numa_of(host)
    result: dict = {"rounds": [], "numa_nodes": sorted(set(numa.values()))}
    pooled: list[dict] = []
    for rnd in sorted(rounds(jsonl(files.get("events.jsonl", b""))), key=lambda r: r["k"]):
        st = steps_of(lines, rnd)
        pooled += st
        result["rounds"].append({**rnd, **summarise(st, numa, gpu, vcpu)})
    shares = [r["slow_share"] for r in result["rounds"] if r["slow_share"] is not None]
    base_rounds = [r for r in result["rounds"] if r["name"] in ("base", "unpin")]
    base_steps = [s for r in base_rounds for s in steps_of(lines, r)]
    enough = [r for r in result["rounds"] if r["slow"]["n"] >= 20 and r["fast"]["n"] >= 20]
    result["read_on"] = "base + unpin rounds" if base_steps else "all rounds"
    result["pooled"] = summarise(base_steps or pooled, numa, gpu, vcpu)
    result["outcome"] = outcome(result["pooled"], shares)
    result["rounds_with_20_each"] = [r["name"] for r in enough]
    result["burst"] = burst_read(files, lines)
    result["probe_r_1s"] = second_bins_r(pooled, vcpu)
    result["probe"] = probe_context(pooled, vcpu)
    result["guest_cpu"] = guest_cpu(d / "cpu-lone.jsonl.xz", pooled)
    print(f"lease 10 read: {len(lines)} step lines, {len(gpu)} GPU samples, {len(vcpu)} vCPU probes, NUMA nodes "
          f"{result['numa_nodes'] or 'n/a'}; fast L <= {FAST_MS} ms, slow L >= {SLOW_MS} ms")
    cols = ("n", "L", "wall", "cpu", "gpu", "g1", "rq", "it_cpu", "gc2_ms", "migrated_share", "common_cpu",
            "alloc_share", "sm_mhz", "power_w", "vcpu_cpu_ms", "vcpu_wall_ms")
    print("round        mode   " + " ".join(f"{c:>9}" for c in cols) + "  reasons")
    for r in result["rounds"] + [{"k": "-", "name": "pooled", **result["pooled"]}]:
        print(f"{r['k']} {r['name']:8s} slow share {r['slow_share']}, mean L {r['mean_L']} ms over {r['steps']} steps")
        for mode in ("slow", "fast"):
            s = r[mode]
            print(f"             {mode:5s}  " + " ".join(f"{str(s[c]):>9}" for c in cols) + f"  {s['reasons']}")
    print(f"outcome: {result['outcome']} (read on {result['read_on']})")
    print(f"vCPU probe against the steps, 1 s bins over every round: Pearson r = {result['probe_r_1s']}")
    print("vCPU probe on its own (every round): " + json.dumps(result["probe"]))
    print("guest CPU in mostly-slow / all-fast seconds: " + json.dumps(result["guest_cpu"]))
    if result["burst"]:
        print("burst: " + json.dumps(result["burst"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
