"""Router overhead side by side: sglang-router's Rust PD router vs our router (batch API and HTTP), one run.

    python3 -m venv .venv-router && .venv-router/bin/pip install sglang-router==0.3.2   # once
    .venv/bin/python benchmarks/router_vs_sglang_router.py [--requests 300] [--concurrency 8,32,128]

client -> {sglang-router (a) | PDRouter.generate_batch over a Serve handle (b) | Serve HTTP /generate (c)}
  -> the same simulated prefill + decode workers at ~zero cost; baseline: an in-process PDDispatcher (no
  router process at all). The workers report a local directory as model_path so sglang-router does not try
  to fetch a tokenizer. Modes alternate per concurrency so load drift on a shared machine hits all alike.
Prints a markdown table: req/s, p50/p99, added p50/p99 over the baseline, req/s ratio to (a).
The request paths themselves live in benchmarks/router_throughput.py; this script only arranges the
comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import router_throughput as paths  # noqa: E402

from orchestrator.config import RunConfig, load_config

LABELS = {"direct": "baseline: in-process dispatcher", "rust": "(a) sglang-router 0.3.2 (Rust, PD)",
          "handle": "(b) ours: batch API (Serve handle)", "http": "(c) ours: HTTP /generate (Serve proxy)"}
MODES = ("direct", "rust", "handle", "http")


def bench_config(result_dir: str) -> RunConfig:
    """Embedded default at ~zero cost; model_path = a local model directory (tokenizer stays local)."""
    from orchestrator.cluster.ports import free_port

    return load_config(ROOT / "configs" / "default.yaml", [
        "engine.sim.profile=cpu-fast", "engine.sim.time_scale=0.0001", "engine.sim.startup_s=0",
        f"model.path={ROOT / 'models' / 'deepseek-v2-lite'}",
        f"router.port={free_port()}", "metrics.exporter_port=0", f"benchmark.result_dir={result_dir}",
        "benchmark.warmup.policy=none",
    ])


def router_python(arg: str | None) -> str:
    python = arg or str(ROOT / ".venv-router" / "bin" / "python")
    probe = subprocess.run([python, "-c", "import sglang_router"], capture_output=True)
    if probe.returncode != 0:
        raise SystemExit(f"--sglang-router {python}: no sglang_router there; create it with "
                         "`python3 -m venv .venv-router && .venv-router/bin/pip install sglang-router==0.3.2`")
    return python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per (path, concurrency)")
    parser.add_argument("--concurrency", default="8,32,128", help="comma-separated clients in flight")
    parser.add_argument("--output-len", type=int, default=4)
    parser.add_argument("--sglang-router", metavar="PYTHON", default=None,
                        help="interpreter with sglang-router 0.3.2 (default .venv-router/bin/python)")
    args = parser.parse_args()
    python = router_python(args.sglang_router)
    rows: list[dict] = []
    with paths.deployed_router("router-vs", python) as bench:
        for c in (int(x) for x in args.concurrency.split(",")):
            for mode in MODES:
                reqs = paths.make_requests(args.requests, args.output_len)
                if mode == "direct":
                    elapsed, lat = asyncio.run(paths.run_direct(bench.endpoints, reqs, c))
                elif mode == "handle":
                    elapsed, lat = paths.run_handle(bench.router, reqs, c)
                else:
                    elapsed, lat = asyncio.run(paths.run_http(bench.urls[mode], reqs, c))
                row = {"mode": mode, "c": c, "n": len(lat), "rps": len(lat) / elapsed,
                       "p50": paths.percentile(lat, 50) * 1e3, "p99": paths.percentile(lat, 99) * 1e3}
                rows.append(row)
                print(f"{mode:7s} c={c:<4d} {row['rps']:8.1f} req/s  p50 {row['p50']:7.1f} ms  p99 {row['p99']:7.1f} ms",
                      file=sys.stderr, flush=True)
    print_table(rows, args)
    return 0


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    load = os.getloadavg()[0]
    print(f"\nRouter overhead, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores "
          f"(load average {load:.1f} at the end); sim workers 1 prefill + 1 decode at time_scale=1e-4, "
          f"64-token prompts, {args.output_len} output tokens, {args.requests} requests per cell.\n")
    print("| path | concurrency | req/s | ratio to (a) | p50 ms | p99 ms | added p50 ms | added p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    by = {(r["mode"], r["c"]): r for r in rows}
    for r in rows:
        base, rust = by[("direct", r["c"])], by[("rust", r["c"])]
        added = ("", "") if r["mode"] == "direct" else (f"{r['p50'] - base['p50']:+.1f}", f"{r['p99'] - base['p99']:+.1f}")
        print(f"| {LABELS[r['mode']]} | {r['c']} | {r['rps']:.0f} | {r['rps'] / rust['rps']:.2f}x | {r['p50']:.1f} "
              f"| {r['p99']:.1f} | {added[0]} | {added[1]} |")


if __name__ == "__main__":
    raise SystemExit(main())
