"""Ordering and admission for the known finite batch, measured with the virtual-time simulator (labelled simulated).

    .venv/bin/python benchmarks/ordering.py [--configs configs/default.yaml,configs/h200-1p1d-tp8.yaml]
        [--orderings arrival,longest-first,interleave] [--limits auto,kv/2,kv,2kv,all]

batch (1000 ShareGPT prompts, seed 2025, as `bench` samples it) -> bench's own `order_requests` ->
plan/simulate.py's whole-run simulation with the client keeping `limit` requests in flight -> table.
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
from orchestrator.plan.simulate import batch_shapes, client_concurrency, simulate_run  # noqa: E402
from orchestrator.stats import percentile  # noqa: E402
from orchestrator.records import BenchRequest  # noqa: E402
from orchestrator.workload.batch import order_requests  # noqa: E402
from orchestrator.provenance import recorded  # noqa: E402


def ordered(batch: list[tuple[int, int]], ordering: str) -> list[tuple[int, int]]:
    """Apply bench's ordering to (prompt_len, output_len) pairs."""
    reqs = [BenchRequest(index=i, input_ids=[], output_len=o, prompt_len=p) for i, (p, o) in enumerate(batch)]
    return [(r.prompt_len, r.output_len) for r in order_requests(reqs, ordering)]


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="configs/default.yaml,configs/h200-1p1d-tp8.yaml")
    parser.add_argument("--orderings", default="arrival,longest-first,interleave")
    parser.add_argument("--limits", default="auto,kv/4,kv/2,kv,all")
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None, help="results folder: manifest.json + stdout in output.txt")
    args = parser.parse_args()
    with recorded(args.out):
        print(f"Ordering and admission, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, virtual-time simulation "
              f"(orchestrator/plan/simulate.py; {platform.machine()}, {os.cpu_count()} cores; numbers are simulated).\n")
        print("| config | GPU | batch | decode KV tokens | limit | in flight | ordering | duration s | output tok/s "
              "| TTFT p50 s | TTFT p99 s | vs arrival/auto |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for path in args.configs.split(","):
            cfg = load_config(ROOT / path, [f"benchmark.num_prompts={args.num_prompts}"], paths_from=ROOT)
            batch, source = batch_shapes(cfg)
            ref = None
            for limit_name, limit in limits(cfg, batch, args.limits.split(",")).items():
                for ordering in args.orderings.split(","):
                    run = simulate_run(cfg, ordered(batch, ordering), max_concurrency=limit)
                    if ref is None:  # first cell = today's default (arrival order, auto limit)
                        ref = run.duration_s
                    print(f"| {Path(path).name} | {run.gpu} | {len(batch)} {source} | {decode_kv_tokens(cfg)} | {limit_name} "
                          f"| {limit if limit is not None else len(batch)} | {ordering} | {run.duration_s:.1f} "
                          f"| {run.output_tokens / run.duration_s:.0f} | {percentile(run.ttft_s, 50):.2f} "
                          f"| {percentile(run.ttft_s, 99):.2f} | {ref / run.duration_s:.3f}x |", flush=True)
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
