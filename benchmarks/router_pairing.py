"""Pairing policies on the simulator: each `router.policy` drives the same batch through 2 prefill + 2 decode
simulated SGLang servers (fresh servers per run, so every policy starts with cold prefix caches).

    .venv/bin/python benchmarks/router_pairing.py [--policies all] [--workloads sharegpt,prefix] [--time-scale 0.5] \\
        [--out benchmarks/results/2026-11-24-router-pairing]

Workloads:
- `sharegpt`: the bench's ShareGPT batch (`workload.batch.sample_batch`, seed 2025), `--sharegpt-prompts`
  prompts, `--sharegpt-in-flight` at a time;
- `prefix`: multi-turn chat, prefix-heavy: `--conversations` conversations of `--turns` turns; every
  conversation has its own `--context-tokens`-token context (system prompt + documents), turn t's prompt is
  that context + the earlier turns (question + answer each) + a new 50-token question, `--answer-tokens`
  output tokens; turns arrive turn by turn, the conversations in a random order within each turn,
  `--prefix-in-flight` requests in flight.
The router is the in-process dispatcher and batch driver (`orchestrator.router.batch`, exactly what the
router replica runs; no Serve, so the router costs the same for every policy). The servers are
`python -m orchestrator.engines.sim.server` (DeepSeek-R1 W4A8 TP8 on simulated H100, KV over HTTP so no
NIXL progress threads compete for the CPU), every modelled duration x `--time-scale`; numbers are
**simulated** and reported in modelled seconds (wall / time scale).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.cluster.ports import free_port  # noqa: E402
from orchestrator.provenance import command_line, write_manifest  # noqa: E402
from orchestrator.records import BenchRequest, Role, WorkerEndpoint  # noqa: E402
from orchestrator.router.batch import run_batch  # noqa: E402
from orchestrator.router.dispatch.dispatcher import PDDispatcher  # noqa: E402
from orchestrator.router.dispatch.policies import POLICIES  # noqa: E402
from orchestrator.router.dispatch.settings import DispatchSettings  # noqa: E402

SIM_ARGS = ["--served-model-name", "DeepSeek-R1", "--model-preset", "DeepSeek-R1", "--quantization", "w4a8",
            "--tp-size", "8", "--profile", "H100-SXM", "--kv-transfer", "http", "--startup-s", "0"]


def start_servers(n_prefill: int, n_decode: int, time_scale: float, logs: Path) -> tuple[list, list[WorkerEndpoint]]:
    procs, endpoints = [], []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "UCX_NET_DEVICES": "lo"}
    counts: tuple[tuple[Role, int], ...] = (("prefill", n_prefill), ("decode", n_decode))
    for role, n in counts:
        for i in range(n):
            port, boot = free_port(), free_port()
            argv = [sys.executable, "-m", "orchestrator.engines.sim.server", "--host", "127.0.0.1", "--port", str(port),
                    "--disaggregation-mode", role, "--disaggregation-bootstrap-port", str(boot),
                    "--time-scale", repr(time_scale), "--sim-node", f"127.0.0.1/{role}", *SIM_ARGS]
            procs.append(subprocess.Popen(argv, env=env, stdout=open(logs / f"{role}-{i}.log", "wb"),
                                          stderr=subprocess.STDOUT, start_new_session=True))
            endpoints.append(WorkerEndpoint(role, f"{role}-{i}", f"http://127.0.0.1:{port}",
                                            "127.0.0.1" if role == "prefill" else None,
                                            boot if role == "prefill" else None))
    deadline = time.monotonic() + 120
    for proc, ep in zip(procs, endpoints):
        while True:
            if proc.poll() is not None:
                stop_servers(procs)
                raise SystemExit(f"{ep.name} exited with {proc.returncode}; see {logs}")
            try:
                with urllib.request.urlopen(ep.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                stop_servers(procs)
                raise SystemExit(f"{ep.name} not healthy after 120 s; see {logs}")
            time.sleep(0.2)
    return procs, endpoints


def stop_servers(procs: list) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def sharegpt_batch(n: int) -> list[BenchRequest]:
    from orchestrator.config import load_config
    from orchestrator.workload.batch import sample_batch

    cfg = load_config(ROOT / "configs" / "default.yaml", [f"model.path={ROOT / 'models' / 'deepseek-v2-lite'}"])
    return sample_batch(cfg, n)


def prefix_batch(conversations: int, turns: int, context_tokens: int, answer_tokens: int,
                 seed: int = 2025) -> list[BenchRequest]:
    rng = random.Random(seed)
    contexts = [[rng.randrange(1000, 100000) for _ in range(context_tokens)] for _ in range(conversations)]
    history: list[list[int]] = [[] for _ in range(conversations)]
    out: list[BenchRequest] = []
    for _turn in range(turns):
        for c in rng.sample(range(conversations), conversations):  # users answer at different times
            question = [rng.randrange(1000, 100000) for _ in range(50)]
            out.append(BenchRequest(index=len(out), input_ids=contexts[c] + history[c] + question,
                                    output_len=answer_tokens))
            history[c] = history[c] + question + [rng.randrange(1000, 100000) for _ in range(answer_tokens)]
    return out


async def drive(endpoints: list[WorkerEndpoint], policy: str, reqs: list[BenchRequest], in_flight: int) -> list:
    d = PDDispatcher(DispatchSettings(policy=policy))
    d.set_workers(endpoints)
    results = []
    try:
        async for r in run_batch(d, reqs, in_flight, time.time() + 3600):
            results.append(r)
    finally:
        await d.close()
    return results


def summarise(results: list, wall_s: float, time_scale: float) -> dict:
    ok = [r for r in results if r.status == "ok"]

    def pct(xs: list[float], q: float) -> float:  # nearest rank, as the recorded runs were summarised
        return sorted(xs)[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] / time_scale

    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    per_prefill: dict[str, int] = {}
    for r in ok:
        per_prefill[r.prefill_worker] = per_prefill.get(r.prefill_worker, 0) + 1
    duration = wall_s / time_scale
    return {"completed": len(ok), "failed": len(results) - len(ok), "duration_s": round(duration, 2),
            "output_tok_s": round(sum(r.completion_tokens for r in ok) / duration, 1),
            "ttft_p50_s": round(pct(ttft, 0.5), 3), "ttft_p99_s": round(pct(ttft, 0.99), 3),
            "e2e_p50_s": round(pct(e2e, 0.5), 3), "e2e_p99_s": round(pct(e2e, 0.99), 3),
            "requests_per_prefill": dict(sorted(per_prefill.items()))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="all", help=f"comma-separated, or all: {','.join(POLICIES)}")
    parser.add_argument("--workloads", default="sharegpt,prefix")
    parser.add_argument("--time-scale", type=float, default=0.5)
    parser.add_argument("--sharegpt-prompts", type=int, default=200)
    parser.add_argument("--sharegpt-in-flight", type=int, default=64)
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--context-tokens", type=int, default=8000,
                        help="per conversation; 64 x 8000 is more than one prefill server's KV (its prefix cache)")
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--prefix-in-flight", type=int, default=32,
                        help="prefix batch's requests in flight (64 x 8k tokens would not fit the decodes' KV)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.out is not None:
        write_manifest(args.out, command_line())  # before the run: started_at is its start
    policies = list(POLICIES) if args.policies == "all" else args.policies.split(",")
    unknown = set(policies) - set(POLICIES)
    if unknown:
        raise SystemExit(f"--policies: unknown {sorted(unknown)}; choose from {','.join(POLICIES)}")
    batches = {}
    for w in args.workloads.split(","):
        if w == "sharegpt":
            batches[w] = (sharegpt_batch(args.sharegpt_prompts), args.sharegpt_in_flight)
        elif w == "prefix":
            batches[w] = (prefix_batch(args.conversations, args.turns, args.context_tokens, args.answer_tokens),
                          args.prefix_in_flight)
        else:
            raise SystemExit(f"--workloads: unknown {w!r}; choose from sharegpt,prefix")
    uptime = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()  # noqa: E731
    rows = []
    started = uptime()
    logs = Path(tempfile.mkdtemp(prefix="router-pairing-"))
    for workload, (reqs, in_flight) in batches.items():
        for policy in policies:
            procs, endpoints = start_servers(2, 2, args.time_scale, logs)
            try:
                before = os.getloadavg()[0]
                t0 = time.perf_counter()
                results = asyncio.run(drive(endpoints, policy, reqs, in_flight))
                wall = time.perf_counter() - t0
            finally:
                stop_servers(procs)
            row = {"workload": workload, "policy": policy, "prompts": len(reqs), "in_flight": in_flight,
                   **summarise(results, wall, args.time_scale), "load1_before": round(before, 1)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    ended = uptime()
    lines = ["| workload | policy | completed | duration s | output tok/s | TTFT p50 s | TTFT p99 s | e2e p50 s | "
             "e2e p99 s | requests per prefill |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = next(b for b in rows if b["workload"] == r["workload"] and b["policy"] == rows[0]["policy"])
        lines.append(f"| {r['workload']} | {r['policy']} | {r['completed']}/{r['prompts']} | {r['duration_s']} "
                     f"({r['duration_s'] / base['duration_s']:.2f}x) | {r['output_tok_s']} | {r['ttft_p50_s']} | "
                     f"{r['ttft_p99_s']} | {r['e2e_p50_s']} | {r['e2e_p99_s']} | "
                     f"{', '.join(str(v) for v in r['requests_per_prefill'].values())} |")
    table = "\n".join(lines)
    header = (f"Pairing policies, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, 2 simulated prefill + 2 "
              f"decode servers (R1 W4A8 TP8, simulated H100), time scale {args.time_scale}; all times modelled "
              f"seconds (simulated). Load: `{started}` at the start, `{ended}` at the end.")
    print("\n" + header + "\n\n" + table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        command = command_line()  # the manifest's too
        (args.out / "result.json").write_text(json.dumps({"rows": rows, "command": command, "uptime_start": started,
                                                          "uptime_end": ended, "cpus": os.cpu_count()}, indent=1))
        (args.out / "README.md").write_text(f"# Pairing policies on the simulator\n\nCommand:\n\n    {command}\n\n"
                                            f"{header}\n\n{table}\n\nEvery run: `result.json`.\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
