"""Router throughput on this machine: req/s and added latency of the router paths, on zero-cost sim workers.

    .venv/bin/python benchmarks/router_throughput.py [--requests 200] [--concurrency 1,16,64] [--output-len 4]

Starts a local 2-node Ray cluster, deploys the embedded-default app with simulated engines whose
durations are scaled to ~0 (`engine.sim.time_scale`), and drives the same requests three ways:
- `direct`: an in-process `PDDispatcher` straight to the engines (no Serve): the baseline;
- `handle`: the benchmark's path, `PDRouter.generate_batch_chunks` over a stream=True Serve handle;
- `http`: SGLang-style `POST /generate` (non-stream) to the router replica's own HTTP server, concurrent clients;
- `rust` (with `--sglang-router PYTHON`): the same HTTP load on `sglang-router` 0.3.2's Rust router in
  PD mode (round robin) in front of the same workers; PYTHON is an interpreter that has `sglang_router`,
  e.g. a venv outside the repo: `python3 -m venv /tmp/venv-router && /tmp/venv-router/bin/pip install
  sglang-router==0.3.2`.
Latency per request is wall time from dispatch to the client having the answer; "added" is the path's
p50/p99 minus the direct path's at the same concurrency. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.config import RunConfig, load_config
from orchestrator.provenance import recorded
from orchestrator.records import BenchRequest
from orchestrator.router.batch import run_batch
from orchestrator.router.dispatch.dispatcher import PDDispatcher
from orchestrator.router.dispatch.settings import DispatchSettings
from orchestrator.stats import percentile


def make_requests(n: int, output_len: int) -> list[BenchRequest]:
    return [BenchRequest(index=i, input_ids=list(range(1, 65)), output_len=output_len) for i in range(n)]


async def run_direct(endpoints, reqs, concurrency: int) -> tuple[float, list[float]]:
    d = PDDispatcher(DispatchSettings())
    d.set_workers(endpoints)
    latencies = []
    start = time.perf_counter()
    async for r in run_batch(d, reqs, concurrency, time.time() + 600):
        assert r.status == "ok" and r.sent_at is not None, r.error
        latencies.append(time.time() - r.sent_at)
    elapsed = time.perf_counter() - start
    await d.close()
    return elapsed, latencies


def run_handle(router, reqs, concurrency: int) -> tuple[float, list[float]]:
    """The bench driver's path; latency = the router's own send-to-answer time per request (what bench
    reports), so the 50 ms result chunking does not count."""
    latencies = []
    start = time.perf_counter()
    for chunk in router.options(stream=True).generate_batch_chunks.remote(reqs, concurrency, time.time() + 600):
        for r in chunk:
            assert r.status == "ok", r.error
            latencies.append(r.done_at - r.sent_at)
    return time.perf_counter() - start, latencies


async def run_http(url: str, reqs, concurrency: int, api: str = "generate") -> tuple[float, list[float]]:
    """Closed loop of `concurrency` clients over keep-alive connections: SGLang `/generate` or OpenAI
    `/v1/completions` (token-id prompt), both non-stream; latency as the client sees it."""
    queue = list(reqs)
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            while queue:
                req = queue.pop()
                if api == "openai":
                    path, body = "/v1/completions", {"model": "m", "prompt": req.input_ids, "temperature": 0,
                                                     "max_tokens": req.output_len, "ignore_eos": True}
                else:
                    path, body = "/generate", {"input_ids": req.input_ids, "sampling_params": {
                        "temperature": 0, "max_new_tokens": req.output_len, "ignore_eos": True}}
                t0 = time.time()
                async with session.post(url + path, json=body) as resp:
                    await resp.read()
                    assert resp.status == 200, await resp.text()
                latencies.append(time.time() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return time.perf_counter() - start, latencies


def start_sglang_router(python: str, endpoints, port: int, log_path: Path,
                        launcher: list[str] | None = None) -> subprocess.Popen:
    """SGLang's Rust PD router over our workers; returns once it answers /health. `launcher` is the argv
    that starts it (default: `PYTHON -m sglang_router.launch_router`; the newer gateway: `smg launch`);
    both take the same PD flags. Its Prometheus port is a free one (two gateways must not share 29000)."""
    from orchestrator.cluster.ports import free_port

    argv = (launcher or [python, "-m", "sglang_router.launch_router"]) + [
        "--pd-disaggregation", "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    for e in endpoints:
        if e.role == "prefill":
            argv += ["--prefill", e.url, str(e.bootstrap_port)]
        elif e.role == "decode":
            argv += ["--decode", e.url]
    proc = subprocess.Popen(argv, stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    import urllib.request

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{argv[0]} exited with {proc.returncode}; log {log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit(f"{argv[0]} not healthy after 120 s; log {log_path}")


def bench_config(result_dir: str) -> RunConfig:
    from orchestrator.cluster.ports import free_port

    root = Path(__file__).resolve().parents[1]
    return load_config(root / "configs" / "default.yaml", [
        "engine.sim.profile=cpu-fast", "engine.sim.time_scale=0.0001", "engine.sim.startup_s=0",
        f"router.port={free_port()}", "metrics.exporter_port=0", f"benchmark.result_dir={result_dir}",
        "benchmark.warmup.policy=none",
    ])


@dataclass
class RouterSession:
    """A deployed router and its workers: the Serve handle, the engines, and the HTTP front doors by name."""

    router: Any  # Serve DeploymentHandle of PDRouter
    endpoints: list
    urls: dict[str, str] = field(default_factory=dict)  # "http": ours, "rust": sglang-router's, other gateways
    gateways: dict[str, subprocess.Popen] = field(default_factory=dict)  # the gateway processes by name


@contextlib.contextmanager
def deployed_router(name: str, sglang_router_python: str | None = None,
                    gateways: dict[str, list[str]] | None = None) -> Iterator[RouterSession]:
    """A local cluster with 1P1D zero-cost sim workers and our router (plus sglang-router in front of the
    same workers if an interpreter that has it is given, and each of `gateways`: name -> launcher argv);
    everything is stopped on exit."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("UCX_NET_DEVICES", "lo")

    from ray import serve

    from deployments.app import ROUTER_APP, deploy, expected_workers
    from orchestrator.cluster.connect import connect
    from orchestrator.cluster.ports import free_port

    tmp = tempfile.mkdtemp(prefix=name + "-")
    cfg = bench_config(tmp)
    session = connect(cfg, Path(tmp) / "cluster.json")
    started: dict[str, subprocess.Popen] = {}
    try:
        deploy(cfg, name, timeout_s=300)
        router = serve.get_app_handle(ROUTER_APP)
        endpoints = router.wait_ready.remote(expected_workers(cfg), 300).result(timeout_s=330)
        urls = {"http": f"http://{cfg.router.host}:{cfg.router.port}"}
        launchers = dict(gateways or {})
        if sglang_router_python:
            launchers["rust"] = [sglang_router_python, "-m", "sglang_router.launch_router"]
        for gateway, launcher in launchers.items():
            port = free_port()
            started[gateway] = start_sglang_router("", endpoints, port, Path(tmp) / f"{gateway}.log", launcher)
            urls[gateway] = f"http://127.0.0.1:{port}"
        yield RouterSession(router, endpoints, urls, started)
    finally:
        for proc in started.values():
            proc.terminate()
            proc.wait(timeout=10)
        serve.shutdown()
        session.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per (mode, concurrency)")
    parser.add_argument("--concurrency", default="1,16,64", help="comma-separated max in flight")
    parser.add_argument("--output-len", type=int, default=4)
    parser.add_argument("--modes", default="direct,handle,http")
    parser.add_argument("--sglang-router", metavar="PYTHON", default=None,
                        help="interpreter with sglang-router 0.3.2 installed: adds the 'rust' mode")
    parser.add_argument("--out", type=Path, default=None, help="results folder: manifest.json + stdout in output.txt")
    args = parser.parse_args()
    with recorded(args.out):
        rows = []
        modes = args.modes.split(",") + (["rust"] if args.sglang_router else [])
        with deployed_router("router-bench", args.sglang_router) as bench:
            for c in (int(x) for x in args.concurrency.split(",")):
                baseline: tuple[float, float] | None = None
                for mode in modes:
                    reqs = make_requests(args.requests, args.output_len)
                    if mode == "direct":
                        elapsed, lat = asyncio.run(run_direct(bench.endpoints, reqs, c))
                    elif mode == "handle":
                        elapsed, lat = run_handle(bench.router, reqs, c)
                    elif mode in bench.urls:
                        elapsed, lat = asyncio.run(run_http(bench.urls[mode], reqs, c))
                    else:
                        raise SystemExit(f"--modes: unknown mode {mode!r}; use direct, handle, http")
                    p50, p99 = percentile(lat, 50, "nearest") * 1e3, percentile(lat, 99, "nearest") * 1e3
                    if mode == "direct":
                        baseline = (p50, p99)
                    added = (f"{p50 - baseline[0]:+.1f}", f"{p99 - baseline[1]:+.1f}") if baseline and mode != "direct" else ("", "")
                    rows.append((mode, c, len(lat), len(lat) / elapsed, p50, p99, *added))
                    print(f"{mode:7s} c={c:<4d} {len(lat) / elapsed:8.1f} req/s  p50 {p50:7.1f} ms  p99 {p99:7.1f} ms",
                          file=sys.stderr)
        load = os.getloadavg()
        print(f"\nRouter throughput, {os.cpu_count()} cores, load average {load[0]:.1f} at the end; sim workers "
              f"at time_scale=1e-4, {args.output_len} output tokens, 64-token prompts, 1 prefill + 1 decode.\n")
        print("| path | concurrency | requests | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms |")
        print("|---|---|---|---|---|---|---|---|")
        for mode, c, n, rps, p50, p99, a50, a99 in rows:
            print(f"| {mode} | {c} | {n} | {rps:.1f} | {p50:.1f} | {p99:.1f} | {a50} | {a99} |")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
