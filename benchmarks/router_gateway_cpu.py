"""Our gateway's CPU per request, two source trees side by side (before/after a change), against sglang-router and a
direct client, in front of the same two zero-cost simulated engines, interleaved in one run; no Ray.

    .venv/bin/python benchmarks/router_gateway_cpu.py --before ../before-tree --concurrency 1,32 --requests 400 \\
        --rounds 5 --out benchmarks/results/<date>-<slug>

Each gateway of ours is the router replica's HTTP server without Serve around it (RouterCore + RouterMetrics +
serve_http in a process of its own, from `--before` or this tree), so the CPU of its process from /proc is the
gateway's own per request (the Serve replica adds Ray's threads, < 0.05 ms per request: docs/performance.md).
Cells: `before-http` / `after-http` (`POST /generate`), `before-openai` / `after-openai` (`POST /v1/completions`,
token-id prompt), `sglang-router` (0.3.2, PD mode, `/generate`), `direct` (the client pairs itself: the same body
to prefill and decode, as mini_lb does). Closed loops of N keep-alive aiohttp clients, non-stream, 64-token prompts,
4 output tokens; within a round every cell runs once per concurrency in an order that rotates between rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import router_throughput as paths  # noqa: E402
from benchmarks.router_vs_sglang_router import process_cpu_s, run_direct_http  # noqa: E402
from orchestrator.stats import percentile  # noqa: E402
from orchestrator.provenance import command_line, write_manifest  # noqa: E402

SERVE = """
import asyncio, json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from orchestrator.config import RunConfig
from orchestrator.observe.metrics import RouterMetrics
from orchestrator.records import WorkerEndpoint
from orchestrator.router.core import RouterCore
from orchestrator.router.http_app import serve_http
import orchestrator.router.http_app as app
assert app.__file__.startswith(sys.argv[1]), app.__file__

async def main():
    cfg = RunConfig.model_validate_json(Path(sys.argv[2]).read_text())
    core = RouterCore(cfg, "gateway-cpu", RouterMetrics("gateway-cpu", cfg.layout.describe()))
    core.follow(1, [WorkerEndpoint(**e) for e in json.loads(Path(sys.argv[3]).read_text())])
    _, task = await serve_http(core, "127.0.0.1", int(sys.argv[4]))
    await task

asyncio.run(main())
"""


def start_gateway(tree: Path, cfg_path: Path, endpoints_path: Path, port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(tree.resolve()), str(cfg_path), str(endpoints_path),
                             str(port)], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gateway from {tree} exited {proc.returncode}; log {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"gateway from {tree} not healthy after 60 s; log {log}")


def table(rows: list[dict]) -> str:
    lines = ["| cell | concurrency | gateway CPU ms/request (median, min-max over rounds) | vs sglang-router's "
             "(median of per-round ratios) | req/s (median) | p50 ms (median) | added p50 ms over direct |",
             "|---|---|---|---|---|---|---|"]
    by: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        by.setdefault((r["cell"], r["concurrency"]), []).append(r)
    for c in sorted({r["concurrency"] for r in rows}):
        base = {r["round"]: r["cpu_ms"] for r in by[("sglang-router", c)]}
        direct = statistics.median(r["p50_ms"] for r in by[("direct", c)])
        for cell in CELLS:
            cells = by.get((cell, c), [])
            if not cells:
                continue
            cpu = [r["cpu_ms"] for r in cells]
            ratio = "" if cell == "direct" else f"{statistics.median(r['cpu_ms'] / base[r['round']] for r in cells):.2f}x"
            p50 = statistics.median(r["p50_ms"] for r in cells)
            lines.append(f"| {cell} | {c} | {statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f}) | "
                         f"{ratio} | {statistics.median(r['req_s'] for r in cells):.1f} | {p50:.2f} | "
                         f"{'' if cell == 'direct' else f'{p50 - direct:+.2f}'} |")
    return "\n".join(lines)


CELLS = ("sglang-router", "before-http", "after-http", "before-openai", "after-openai", "direct")


def main() -> int:
    from orchestrator.cluster.ports import free_port
    from tests.support import sim_pd_pair

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the code before the change")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sglang-router", metavar="PYTHON", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    write_manifest(args.out, command_line())
    tmp = Path(tempfile.mkdtemp(prefix="gateway-cpu-"))
    cfg = paths.bench_config(str(tmp))
    rows: list[dict] = []
    load_start = os.getloadavg()
    with sim_pd_pair(cfg) as endpoints:
        (tmp / "cfg.json").write_text(cfg.model_dump_json())
        (tmp / "endpoints.json").write_text(json.dumps([dataclasses.asdict(e) for e in endpoints]))
        procs, urls = {}, {}
        for name, tree in (("before", args.before), ("after", ROOT)):
            port = free_port()
            procs[name] = start_gateway(tree, tmp / "cfg.json", tmp / "endpoints.json", port, args.out / f"{name}.log")
            urls[name] = f"http://127.0.0.1:{port}"
        port = free_port()
        procs["sglang-router"] = paths.start_sglang_router(args.sglang_router, endpoints, port,
                                                           args.out / "sglang-router.log")
        urls["sglang-router"] = f"http://127.0.0.1:{port}"
        try:
            def run(cell: str, n: int, c: int) -> dict:
                reqs = paths.make_requests(n, 4)
                gateway = cell.split("-")[0] if cell != "sglang-router" else cell
                before = process_cpu_s(procs[gateway].pid) if gateway in procs else 0.0
                load = os.getloadavg()[0]
                if cell == "direct":
                    elapsed, lat = asyncio.run(run_direct_http(endpoints, reqs, c))
                else:
                    api = "openai" if cell.endswith("openai") else "generate"
                    elapsed, lat = asyncio.run(paths.run_http(urls[gateway], reqs, c, api))
                cpu = (process_cpu_s(procs[gateway].pid) - before) if gateway in procs else 0.0
                return {"cell": cell, "concurrency": c, "cpu_ms": round(cpu / n * 1e3, 3),
                        "req_s": round(n / elapsed, 1), "p50_ms": round(percentile(lat, 50, "nearest") * 1e3, 3),
                        "p99_ms": round(percentile(lat, 99, "nearest") * 1e3, 3), "load1": round(load, 2)}

            for cell in CELLS:
                run(cell, 64, 16)  # warm-up: connections, first batches, lazy imports
            for rnd in range(1, args.rounds + 1):
                for c in (int(x) for x in args.concurrency.split(",")):
                    k = rnd % len(CELLS)
                    for cell in CELLS[k:] + CELLS[:k]:
                        row = {**run(cell, args.requests, c), "round": rnd}
                        rows.append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(10)
    load_end = os.getloadavg()
    header = (f"Gateway CPU per request, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
              f"load average {load_start[0]:.2f} / {load_start[1]:.2f} / {load_start[2]:.2f} at the start, "
              f"{load_end[0]:.2f} / {load_end[1]:.2f} / {load_end[2]:.2f} at the end; {args.requests} requests per "
              f"cell, {args.rounds} rounds; before = {args.before}, after = this tree.")
    text = header + "\n\n" + table(rows)
    print(text)
    (args.out / "result.json").write_text(json.dumps({"rows": rows, "command": command_line(),
                                                      "load_start": load_start, "load_end": load_end}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
