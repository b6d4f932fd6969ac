"""Ordering and admission for the known finite batch, measured with the virtual-time simulator (labelled simulated).

    .venv/bin/python benchmarks/ordering.py [--configs configs/default.yaml,configs/h200-1p1d-tp8.yaml]
        [--orderings arrival,longest-first,interleave] [--limits auto,kv/2,kv,2kv,all] [--timeline]

batch (1000 ShareGPT prompts, seed 2025, as `bench` samples it) -> bench's own `order_requests` ->
plan/simulation/simulate.py's whole-run simulation with the client keeping `limit` requests in flight -> table.
In-flight limits are derived from decode KV capacity: `kv` = how many requests of the batch's mean
(prompt + output) fit in the decode servers' KV at once; `kv/4`, `kv/2`, `2kv` bracket it; `auto` is bench's default
(every decode server's max running requests); `all` sends the whole batch at t=0.
The same orderings at a reduced scale through the real simulated engine are what `bench` runs with
`-o benchmark.ordering=...`; this script only covers the virtual-time model.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.config import RunConfig, load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.plan.simulation.simulate import batch_shapes, client_concurrency, simulate_run  # noqa: E402
from orchestrator.stats import percentile  # noqa: E402
from orchestrator.workload.batch import order_lengths  # noqa: E402
from orchestrator.provenance import recorded  # noqa: E402


def decode_kv_tokens(cfg: RunConfig) -> int:
    role = "aggregated" if cfg.layout.mode == "aggregated" else "decode"
    return sum(cost_model_for(cfg, r, g).kv_capacity_tokens() * g.count for r, _, g in cfg.layout.groups() if r == role)


def limits(cfg: RunConfig, batch: list[tuple[int, int]], names: list[str]) -> dict[str, int | None]:
    """Named in-flight limits; `kv` = requests of mean size that fit in the decode KV."""
    mean_tokens = statistics.fmean(p + o for p, o in batch)
    kv = max(1, int(decode_kv_tokens(cfg) / mean_tokens))
    table: dict[str, int | None] = {"auto": client_concurrency(cfg), "kv/4": max(1, kv // 4), "kv/2": max(1, kv // 2), "kv": kv,
                                    "2kv": 2 * kv, "all": None}
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"--limits: unknown {unknown}; choose from {', '.join(table)}")
    return {n: table[n] for n in names}


def decode_timeline(cfg: RunConfig, batch: list[tuple[int, int]], limit: int | None) -> str:
    """Where the order moves the run: the decode steps with more running than the largest CUDA graph (eager, launch-
    bound) against the graphed ones, and the most requests running at once."""
    role = "aggregated" if cfg.layout.mode == "aggregated" else "decode"
    graph_max = max(next(cost_model_for(cfg, r, g) for r, _, g in cfg.layout.groups() if r == role).graph_batch_sizes())
    steps: list[tuple[float, int, float]] = []

    def observe(now, server, forward, state) -> None:
        if forward.kind == "decode":
            steps.append((now, len(forward.running), forward.duration_s))

    simulate_run(cfg, batch, max_concurrency=limit, observe=observe)
    eager = [s for s in steps if s[1] > graph_max]
    graphed = [s for s in steps if s[1] <= graph_max]
    where = (f"{len(eager)} steps above {graph_max} running, {eager[0][0]:.1f}-{eager[-1][0] + eager[-1][2]:.1f} s, "
             f"{sum(s[2] for s in eager):.1f} s at {1000 * statistics.fmean(s[2] for s in eager):.0f} ms a step"
             if eager else f"no step above {graph_max} running")
    return (f"{where}; {len(graphed)} graphed steps, {sum(s[2] for s in graphed):.1f} s at "
            f"{1000 * statistics.fmean(s[2] for s in graphed):.0f} ms; most running {max(s[1] for s in steps)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="configs/default.yaml,configs/h200-1p1d-tp8.yaml")
    parser.add_argument("--orderings", default="arrival,longest-first,interleave")
    parser.add_argument("--limits", default="auto,kv/4,kv/2,kv,all")
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--timeline", action="store_true",
                        help="after the table, each config and ordering's decode steps above / within the CUDA graphs")
    parser.add_argument("--out", type=Path, default=None, help="results folder: manifest.json + stdout in output.txt")
    args = parser.parse_args()
    with recorded(args.out):
        print(f"Ordering and admission, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, virtual-time simulation "
              f"(orchestrator/plan/simulation/simulate.py; {platform.machine()}, {os.cpu_count()} cores; numbers are simulated).\n")
        print("| config | GPU | batch | decode KV tokens | limit | in flight | ordering | duration s | output tok/s "
              "| TTFT p50 s | TTFT p99 s | vs arrival/auto |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        timelines: list[str] = []
        for path in args.configs.split(","):
            # the batch in sample order (arrival), then each ordering applied by bench's own order_requests
            cfg = load_config(ROOT / path, [f"benchmark.num_prompts={args.num_prompts}", "benchmark.ordering=arrival"],
                              paths_from=ROOT)
            batch, source = batch_shapes(cfg)
            ref = None
            for limit_name, limit in limits(cfg, batch, args.limits.split(",")).items():
                for ordering in args.orderings.split(","):
                    run = simulate_run(cfg, order_lengths(batch, ordering), max_concurrency=limit)
                    if ref is None:  # first cell = the first ordering at the first limit (default: arrival, auto)
                        ref = run.duration_s
                    print(f"| {Path(path).name} | {run.gpu} | {len(batch)} {source} | {decode_kv_tokens(cfg)} | {limit_name} "
                          f"| {limit if limit is not None else len(batch)} | {ordering} | {run.duration_s:.1f} "
                          f"| {run.output_tokens / run.duration_s:.0f} | {percentile(run.ttft_s, 50):.2f} "
                          f"| {percentile(run.ttft_s, 99):.2f} | {ref / run.duration_s:.3f}x |", flush=True)
            if args.timeline:
                limit = limits(cfg, batch, args.limits.split(",")[:1]).popitem()[1]
                timelines += [f"- {Path(path).name}, {ordering} (limit {args.limits.split(',')[0]}): "
                              f"{decode_timeline(cfg, order_lengths(batch, ordering), limit)}"
                              for ordering in args.orderings.split(",")]
        if timelines:
            print("\nDecode steps above / within the largest CUDA graph (eager steps are launch-bound):\n")
            print("\n".join(timelines))
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
