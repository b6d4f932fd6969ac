"""Lone-server eager decode steps under four conditions (issue 25, /work/eager-analysis.md's measurement B).

Against one running SGLang server (any TP; started by eager_inrun.sh through serve_direct.py), for each variant and
each batch B: B distinct random prompts of --input-len token ids at once, --new-tokens each (greedy, ignore_eos), then
the server log's `Decode batch` lines of that round (the log's bytes between the round's start and end) give the
step as running / gen throughput (first decode line of the round dropped: its interval holds the prefills).
Variants, in this order (each a round per batch):
  alone    non-streaming client (one thread per request), nothing else busy            (B1)
  stream   the same with `stream: true`, each response read line by line (a light SSE reader)   (B2)
  spin     B1 plus --spinners busy-loop processes, unpinned                           (B3)
  pinned   B3 with the scheduler's main thread pinned to one CPU, every other thread of the server, the client and
           the spinners kept off that CPU's core (its SMT siblings idle); spinners one per other core   (B4)
A warm-up round per distinct next_power_of_2(B) first (8 new tokens), so first-use JIT stays out of the rounds.
Writes --out (JSON: per round the client's wall and counts, the log lines and their step summary; the pinning).

Usage: python3 scripts/device/eager_lone.py --url http://127.0.0.1:30300 --log D/lone.log --server-pid PID \
         --out D/lone.json [--batches 300,450,600] [--variants alone,stream,spin,pinned] [--spinners 6] [--deadline-s S]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from orchestrator.calibrate.client import generate_body, post_json, random_ids  # noqa: E402
from orchestrator.calibrate.logparse import decode_lines  # noqa: E402

VARIANTS = ("alone", "stream", "spin", "pinned")
SPIN = "while True:\n    pass\n"


def stream_one(url: str, body: dict, timeout_s: float) -> dict:
    """POST a streaming /generate and read its SSE lines to the end; chunks, first-chunk and total seconds."""
    host, port = url.split("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    t0 = time.perf_counter()
    first, chunks, tokens, status = None, 0, 0, 0
    try:
        conn.request("POST", "/generate", body=json.dumps({**body, "stream": True}),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        status = r.status
        while line := r.readline():
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            chunks += 1
            first = first or time.perf_counter() - t0
            try:
                tokens = json.loads(payload).get("meta_info", {}).get("completion_tokens", tokens)
            except ValueError:
                pass
    except (OSError, http.client.HTTPException) as exc:
        return {"status": 0, "error": f"{type(exc).__name__}: {exc}", "e2e_s": time.perf_counter() - t0}
    finally:
        conn.close()
    return {"status": status, "first_s": first, "chunks": chunks, "completion_tokens": tokens,
            "e2e_s": time.perf_counter() - t0}


def send_round(url: str, prompts: list[list[int]], new_tokens: int, stream: bool, timeout_s: float) -> dict:
    def one(p):
        body = generate_body(p, new_tokens)
        if stream:
            return stream_one(url, body, timeout_s)
        status, resp, dt = post_json(url + "/generate", body, timeout_s)
        meta = resp.get("meta_info", {}) if isinstance(resp, dict) else {}
        return {"status": status, "completion_tokens": meta.get("completion_tokens"), "e2e_s": dt,
                "error": None if status == 200 else str(resp)[:200]}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        rows = list(pool.map(one, prompts))
    wall = time.perf_counter() - t0
    lat = sorted(r["e2e_s"] for r in rows)
    firsts = sorted(r["first_s"] for r in rows if r.get("first_s") is not None)
    return {"n": len(rows), "ok": sum(r["status"] == 200 for r in rows), "wall_s": round(wall, 3),
            "input_tokens": sum(len(p) for p in prompts),
            "completion_tokens": sum(r.get("completion_tokens") or 0 for r in rows),
            "e2e_s_median": round(lat[len(lat) // 2], 3), "e2e_s_max": round(lat[-1], 3),
            "first_s_max": round(firsts[-1], 3) if firsts else None,
            "errors": sorted({r["error"] for r in rows if r.get("error")})[:3]}


def steady_steps(text: str, batch: int) -> dict:
    """The round's decode lines; step = running / gen tok/s over lines with >= 90 % of the batch running, the first
    decode line of the round dropped (its interval holds the prefills)."""
    rows = decode_lines(text)
    lines = [{"t": r["t"], "running": r["running"], "graph": r["cuda_graph"], "gen_tok_s": r["gen_tok_s"],
              "step_ms": round(1e3 * r["running"] / r["gen_tok_s"], 2) if r["gen_tok_s"] > 0 else None}
             for r in rows if r["ranks"] in ("", "TP0")]
    steady = [x for x in lines[1:] if x["step_ms"] and x["running"] >= 0.9 * batch]
    steps = sorted(x["step_ms"] for x in steady)
    med = statistics.median(steps) if steps else None
    return {"lines": lines, "steady": len(steps), "step_ms_median": med, "step_ms_min": steps[0] if steps else None,
            "step_ms_max": steps[-1] if steps else None, "eager": all(not x["graph"] for x in steady) if steady else None}


def descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                kids.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(int(d.name))
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def scheduler_pid(server_pid: int) -> tuple[int, str]:
    """The server's (TP rank 0) scheduler process: SGLang names it sglang::scheduler; else the process holding a
    GPU (nvidia-smi); else the server itself (a simulated server is one process)."""
    procs = descendants(server_pid)
    named = sorted(p for p in procs if comm(p).startswith("sglang::sched"))
    if named:
        return named[0], "comm sglang::scheduler"
    try:
        text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout
        on_gpu = sorted(int(x) for x in text.split() if x.isdigit() and int(x) in procs)
        if on_gpu:
            return on_gpu[0], "nvidia-smi compute app"
    except (OSError, subprocess.SubprocessError):
        pass
    return server_pid, "the server pid (no scheduler found)"


def siblings(cpu: int) -> set[int]:
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return {cpu}
    out: set[int] = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out


def pin_plan(allowed: set[int], spinners: int) -> dict:
    """One CPU for the scheduler's main thread (not CPU 0: interrupts), its core kept free; one CPU per other core
    for the spinners; the rest for everything else."""
    cpus = sorted(allowed)
    main = next((c for c in cpus if c != 0 and len(siblings(c) & allowed) > 1), cpus[1] if len(cpus) > 1 else cpus[0])
    core = siblings(main) & allowed
    others = [c for c in cpus if c not in core]
    firsts: list[int] = []
    used: set[int] = set()
    for c in others:
        if not (siblings(c) & used):
            firsts.append(c)
            used |= siblings(c)
    return {"main_cpu": main, "main_core": sorted(core), "spinner_cpus": (firsts or others)[:spinners],
            "rest": others}


def set_affinity(tid: int, cpus: set[int] | list[int]) -> str | None:
    try:
        os.sched_setaffinity(tid, set(cpus))
        return None
    except OSError as exc:
        return f"{tid}: {exc}"


def pin(server_pid: int, sched: int, plan: dict) -> dict:
    errors = []
    for p in descendants(server_pid) + [os.getpid()]:
        for tid in os.listdir(f"/proc/{p}/task") if Path(f"/proc/{p}/task").exists() else []:
            if int(tid) != sched:
                errors.append(set_affinity(int(tid), plan["rest"]))
    errors.append(set_affinity(sched, [plan["main_cpu"]]))
    return {**plan, "scheduler_main_tid": sched, "errors": [e for e in errors if e][:5]}


def start_spinners(n: int, cpus: list[int] | None) -> list[subprocess.Popen]:
    procs = []
    for i in range(n):
        cmd = [sys.executable, "-c", SPIN]
        if cpus:
            cmd = ["taskset", "-c", str(cpus[i % len(cpus)])] + cmd
        procs.append(subprocess.Popen(cmd))
    return procs


def stop_spinners(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--log", required=True, help="the server's log file (its Decode batch lines)")
    ap.add_argument("--server-pid", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="300,450,600")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--spinners", type=int, default=6)
    ap.add_argument("--input-len", type=int, default=330)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=102400, help="token ids drawn below this (V2-Lite: 102,400)")
    ap.add_argument("--round-timeout-s", type=float, default=120.0)
    ap.add_argument("--deadline-s", type=float, default=0.0, help="skip rounds once this many seconds have passed")
    ap.add_argument("--no-warmup", action="store_true")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b]
    variants = [v for v in args.variants.split(",") if v]
    if bad := [v for v in variants if v not in VARIANTS]:
        ap.error(f"--variants: unknown {bad}; choose from {','.join(VARIANTS)}")
    if not batches or min(batches) < 1:
        ap.error("--batches: a comma list of positive batch sizes, e.g. 300,450,600")
    start = time.monotonic()
    log = Path(args.log)
    sched, how = scheduler_pid(args.server_pid)
    result: dict = {"url": args.url, "server_pid": args.server_pid, "scheduler_pid": sched, "scheduler_found_by": how,
                    "input_len": args.input_len, "new_tokens": args.new_tokens, "spinners": args.spinners,
                    "nproc": os.cpu_count(), "rounds": [], "skipped": []}
    rng = random.Random(2025)
    if not args.no_warmup:   # first use of each power-of-two batch compiles its eager kernels
        for b in sorted({1 << (b - 1).bit_length(): b for b in batches}.values(), reverse=True):
            w = send_round(args.url, [random_ids(rng, args.input_len, args.vocab) for _ in range(b)], 8, False,
                           args.round_timeout_s)
            result.setdefault("warmup", []).append({"batch": b, **w})
            print(f"warm-up {b}: {w['ok']}/{w['n']} in {w['wall_s']} s", flush=True)
    spinners: list[subprocess.Popen] = []
    for variant in variants:
        if variant == "pinned":
            stop_spinners(spinners)
            plan = pin_plan(os.sched_getaffinity(0), args.spinners)
            result["pinning"] = pin(args.server_pid, sched, plan)
            spinners = start_spinners(args.spinners, plan["spinner_cpus"])
            print(f"pinned: {json.dumps(result['pinning'])}", flush=True)
        elif variant == "spin" and not spinners:
            spinners = start_spinners(args.spinners, None)
        for b in batches:
            if args.deadline_s and time.monotonic() - start > args.deadline_s:
                result["skipped"].append({"variant": variant, "batch": b})
                continue
            prompts = [random_ids(rng, args.input_len, args.vocab) for _ in range(b)]
            before = log.stat().st_size if log.exists() else 0
            t0 = time.time()
            client = send_round(args.url, prompts, args.new_tokens, variant == "stream", args.round_timeout_s)
            time.sleep(0.5)   # the round's last log line
            with open(log, "rb") as f:
                f.seek(before)
                text = f.read().decode(errors="replace")
            steps = steady_steps(text, b)
            result["rounds"].append({"variant": variant, "batch": b, "t0": round(t0, 3), "t1": round(time.time(), 3),
                                     "client": client, **steps})
            print(f"{variant:7s} B={b}: {client['ok']}/{client['n']} ok, wall {client['wall_s']} s, step median "
                  f"{steps['step_ms_median']} ms over {steps['steady']} lines (eager {steps['eager']})", flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
    stop_spinners(spinners)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("variant  " + "  ".join(f"B={b:>4}" for b in batches))
    for v in variants:
        cells = {r["batch"]: r["step_ms_median"] for r in result["rounds"] if r["variant"] == v}
        print(f"{v:7s}  " + "  ".join(f"{cells.get(b) or float('nan'):6.1f}" for b in batches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
