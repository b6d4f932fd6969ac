"""Router overhead side by side: our router's batch API, HTTP /generate and OpenAI paths vs SGLang's Rust
PD routers, in front of the same zero-cost simulated workers, in one run; prints the ratio table, writes JSON.

    python3 -m venv .venv-router && .venv-router/bin/pip install sglang-router==0.3.2          # once
    python3 -m venv .venv-router/smg-venv && .venv-router/smg-venv/bin/pip install smg==1.13.0  # once
    .venv/bin/python benchmarks/router_vs_sglang_router.py --concurrency 32,128 --requests 400 --rounds 3 \\
        --out benchmarks/results/2026-11-24-router-<slug>

Paths (client -> ... -> 1 simulated prefill + 1 simulated decode at `engine.sim.time_scale=1e-4`):
- `sglang-router`: `sglang-router` 0.3.2 (`launch_router --pd-disaggregation --policy round_robin`), HTTP
  `/generate`; `smg`: the newest SGLang gateway on the package index (`smg` 1.13.0, `smg launch`, same flags);
- `batch`: the bench driver's path, `PDRouter.generate_batch_chunks` over one stream=True Serve handle;
- `http`: `POST /generate` to the router replica's own HTTP server; `openai`: `POST /v1/completions` there;
- `direct`: no router: each client posts the same body (its own rid and bootstrap room) to the prefill and the decode
  itself, as mini_lb does, and takes the answer when both legs have answered: the floor the "added p50" of the
  gateways is read against (issue 24: the gateway adds <= 1 ms p50 over a direct worker).
HTTP paths are closed loops of N keep-alive clients, latency as the client sees it; the batch path's latency
is the router's own send-to-answer time (what `bench` reports). Within a round every path runs once per
concurrency, in an order that rotates between rounds, so load drift on a shared machine hits all alike.
The ratio is req/s over `sglang-router`'s in the same round and concurrency. Each cell records the load
average around it. The workers report `models/deepseek-v2-lite` as model_path, so no tokenizer download.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import router_throughput as paths  # noqa: E402
from orchestrator.stats import percentile  # noqa: E402
from orchestrator.provenance import command_line, write_manifest  # noqa: E402

PATHS = ("sglang-router", "smg", "batch", "http", "openai", "direct")
GATEWAY_VERSIONS = {"sglang-router": "sglang-router 0.3.2", "smg": "smg 1.13.0"}


def gateway_launchers(router_python: str, smg: str | None) -> dict[str, list[str]]:
    probe = subprocess.run([router_python, "-c", "import sglang_router"], capture_output=True)
    if probe.returncode != 0:
        raise SystemExit(f"--sglang-router {router_python}: no sglang_router there; create it with "
                         "`python3 -m venv .venv-router && .venv-router/bin/pip install sglang-router==0.3.2`")
    out = {"sglang-router": [router_python, "-m", "sglang_router.launch_router"]}
    if smg:
        if not Path(smg).exists():
            raise SystemExit(f"--smg {smg}: not found; create it with `python3 -m venv .venv-router/smg-venv && "
                             ".venv-router/smg-venv/bin/pip install smg==1.13.0`, or pass --smg ''")
        out["smg"] = [smg, "launch"]
    return out


def process_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a process (all its threads) so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def router_pids(bench) -> dict[str, list[int]]:
    """Whose CPU each path spends: our router replica, each gateway, the two simulated engines, this driver."""
    replicas = [bench.router.process_id.remote().result(timeout_s=60)]  # one replica
    engines = [int(p) for e in bench.endpoints for p in subprocess.run(
        ["pgrep", "-f", "--", f"--port {e.url.rsplit(':', 1)[1]} "], capture_output=True, text=True).stdout.split()]
    gateways = {name: [proc.pid] for name, proc in bench.gateways.items()}
    return {"ours": replicas, **gateways, "engines": engines, "driver": [os.getpid()]}


async def run_direct_http(endpoints, reqs, concurrency: int) -> tuple[float, list[float]]:
    """Closed loop of `concurrency` clients doing mini_lb's pairing themselves: the same /generate body with a rid
    and a bootstrap room to the prefill and the decode at once; latency until both answered."""
    import random

    import aiohttp

    prefill = next(e for e in endpoints if e.role == "prefill")
    decode = next(e for e in endpoints if e.role == "decode")
    queue = list(reqs)
    latencies: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * concurrency)) as session:

        async def leg(url: str, body: dict) -> None:
            async with session.post(url + "/generate", json=body) as resp:
                await resp.read()
                assert resp.status == 200, await resp.text()

        async def client() -> None:
            while queue:
                req = queue.pop()
                body = {"input_ids": req.input_ids, "sampling_params": {"temperature": 0, "max_new_tokens":
                        req.output_len, "ignore_eos": True}, "rid": f"{random.getrandbits(128):032x}",
                        "bootstrap_host": prefill.bootstrap_host or "127.0.0.1",
                        "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": random.getrandbits(63) or 1}
                t0 = time.time()
                await asyncio.gather(leg(prefill.url, body), leg(decode.url, body))
                latencies.append(time.time() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return time.perf_counter() - start, latencies


def run_cell(bench, path: str, requests: int, concurrency: int, output_len: int, pids: dict) -> dict:
    reqs = paths.make_requests(requests, output_len)
    load_before = os.getloadavg()[0]
    cpu_before = {k: sum(process_cpu_s(p) for p in v) for k, v in pids.items()}
    if path == "batch":
        elapsed, lat = paths.run_handle(bench.router, reqs, concurrency)
    elif path == "direct":
        elapsed, lat = asyncio.run(run_direct_http(bench.endpoints, reqs, concurrency))
    elif path in ("http", "openai"):
        elapsed, lat = asyncio.run(paths.run_http(bench.urls["http"], reqs, concurrency,
                                                  "openai" if path == "openai" else "generate"))
    else:
        elapsed, lat = asyncio.run(paths.run_http(bench.urls[path], reqs, concurrency))
    router = "ours" if path in ("batch", "http", "openai") else path
    cpu_ms = {k: round((sum(process_cpu_s(p) for p in pids[k]) - cpu_before[k]) / len(lat) * 1e3, 3)
              for k in (router, "engines", "driver") if k in pids}
    return {"path": path, "concurrency": concurrency, "req_s": round(len(lat) / elapsed, 2),
            "router_cpu_ms_per_request": cpu_ms.get(router, 0.0), "engines_cpu_ms_per_request": cpu_ms["engines"],
            "driver_cpu_ms_per_request": cpu_ms["driver"],
            "p50_ms": round(percentile(lat, 50, "nearest") * 1e3, 3), "p99_ms": round(percentile(lat, 99, "nearest") * 1e3, 3),
            "requests": len(lat), "load1_before": round(load_before, 2), "load1_after": round(os.getloadavg()[0], 2)}


def ratio_table(rows: list[dict], rounds: int) -> str:
    """Median over rounds per (path, concurrency): req/s, ratio to sglang-router, p50/p99, added p50/p99 (over
    sglang-router's, and over the direct path's where it ran), CPU per request with its min-max over rounds."""
    by: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        by.setdefault((r["path"], r["concurrency"]), []).append(r)
    lines = ["| path | concurrency | req/s (median) | ratio to sglang-router (median, min-max over rounds) | "
             "p50 ms | p99 ms | added p50 ms | added p99 ms | added p50 ms over direct | router CPU ms/request "
             "(median, min-max) | engines CPU ms/request |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in sorted({r["concurrency"] for r in rows}):
        base = by[("sglang-router", c)]
        base_p50 = statistics.median(r["p50_ms"] for r in base)
        base_p99 = statistics.median(r["p99_ms"] for r in base)
        direct = by.get(("direct", c))
        direct_p50 = statistics.median(r["p50_ms"] for r in direct) if direct else None
        for path in PATHS:
            cells = by.get((path, c))
            if not cells:
                continue
            ratios = [cell["req_s"] / b["req_s"] for cell, b in zip(cells, base)]
            p50 = statistics.median(r["p50_ms"] for r in cells)
            p99 = statistics.median(r["p99_ms"] for r in cells)
            added = ("", "") if path == "sglang-router" else (f"{p50 - base_p50:+.1f}", f"{p99 - base_p99:+.1f}")
            over_direct = "" if direct_p50 is None or path in ("direct", "batch") else f"{p50 - direct_p50:+.2f}"
            cpu = [r["router_cpu_ms_per_request"] for r in cells]
            lines.append(f"| {path} | {c} | {statistics.median(r['req_s'] for r in cells):.1f} | "
                         f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | {p50:.2f} | "
                         f"{p99:.2f} | {added[0]} | {added[1]} | {over_direct} | "
                         f"{statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f}) | "
                         f"{statistics.median(r['engines_cpu_ms_per_request'] for r in cells):.2f} |")
    return "\n".join(lines)


def machine() -> dict:
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "uptime": uptime}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per (path, concurrency, round)")
    parser.add_argument("--concurrency", default="32,128", help="comma-separated clients in flight")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output-len", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=64, help="requests per path before the measured rounds")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--sglang-router", metavar="PYTHON", default=str(ROOT / ".venv-router" / "bin" / "python"),
                        help="interpreter with sglang-router 0.3.2")
    parser.add_argument("--smg", metavar="EXE", default=str(ROOT / ".venv-router" / "smg-venv" / "bin" / "smg"),
                        help="the smg executable ('' to leave it out)")
    parser.add_argument("--out", type=Path, default=None, help="directory for result.json and README.md")
    args = parser.parse_args()
    if args.out is not None:
        write_manifest(args.out, command_line())  # before the run: started_at is its start
    wanted = args.paths.split(",")
    unknown = set(wanted) - set(PATHS)
    if unknown or "sglang-router" not in wanted:
        raise SystemExit(f"--paths: {sorted(unknown) or 'sglang-router missing'}; choose from {','.join(PATHS)} "
                         "(sglang-router is the ratio's base)")
    launchers = gateway_launchers(args.sglang_router, args.smg if "smg" in wanted else None)
    started_at = machine()
    rows: list[dict] = []
    with paths.deployed_router("router-vs", gateways=launchers) as bench:
        pids = router_pids(bench)
        for path in wanted:  # warm-up, not recorded: first connections, lazy imports, the engines' first batches
            run_cell(bench, path, args.warmup, min(32, args.warmup), args.output_len, pids)
        for rnd in range(args.rounds):
            for c in (int(x) for x in args.concurrency.split(",")):
                order = wanted[rnd % len(wanted):] + wanted[:rnd % len(wanted)]
                for path in order:
                    row = {**run_cell(bench, path, args.requests, c, args.output_len, pids), "round": rnd + 1}
                    rows.append(row)
                    print(f"round {rnd + 1} {path:13s} c={c:<4d} {row['req_s']:7.1f} req/s  p50 {row['p50_ms']:7.1f} "
                          f"ms  p99 {row['p99_ms']:7.1f} ms  load {row['load1_before']:.1f}  CPU ms/request: router "
                          f"{row['router_cpu_ms_per_request']}, engines {row['engines_cpu_ms_per_request']}, driver "
                          f"{row['driver_cpu_ms_per_request']}", file=sys.stderr, flush=True)
    ended_at = machine()
    table = ratio_table(rows, args.rounds)
    header = (f"Router overhead, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores; "
              f"load: `{started_at['uptime']}` at the start, `{ended_at['uptime']}` at the end. 1 simulated prefill "
              f"+ 1 decode at time_scale=1e-4, 64-token prompts, {args.output_len} output tokens, {args.requests} "
              f"requests per cell, {args.rounds} rounds after a {args.warmup}-request warm-up per path.")
    print("\n" + header + "\n\n" + table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        command = command_line()  # the manifest's too
        (args.out / "result.json").write_text(json.dumps({
            "rows": rows, "command": command, "machine_start": started_at, "machine_end": ended_at,
            "gateways": {k: GATEWAY_VERSIONS[k] for k in launchers}, "output_len": args.output_len,
            "requests_per_cell": args.requests, "rounds": args.rounds}, indent=1))
        (args.out / "README.md").write_text(
            f"# Router vs SGLang's Rust routers\n\nCommand (from the repository root):\n\n    {command}\n\n"
            f"Machine at the start: {started_at['cpus']} cores, {started_at['platform']}, Python "
            f"{started_at['python']}; `{started_at['uptime']}`.\nAt the end: `{ended_at['uptime']}`.\n\n"
            f"{header}\n\n{table}\n\n`result.json`: every cell (`rows`: path, concurrency, req_s, p50_ms, p99_ms, "
            "round, load average before/after, CPU ms per request of the router process, the two engines and the "
            "driver, from /proc).\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
