"""Warm-up with and without: does it pay for itself inside the deadline? Simulated runs of the embedded default.

    .venv/bin/python benchmarks/warmup.py [--policies none,sglang,dataset] [--set KEY=VALUE ...]

for each benchmark.warmup.policy: spawn `python -m orchestrator bench` (benchmarks/startup.py's runner)
-> result.json phases -> warm-up cost, measured-run duration, total vs deadline.
What the simulator can show: the warm-up's own cost (its phase) and whether the measured run changes.
What it cannot: the simulated engine has no cold-first-batch penalty (costmodel.py charges CUDA graphs and
DeepGEMM JIT to start-up only), so warm-up can never make the simulated measured run faster; its benefit on
real SGLang (first-batch JIT/graph misses on the real shapes) must be measured there.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.startup import first_token_at, job_started_at, run_bench_cli  # noqa: E402
from orchestrator.provenance import recorded  # noqa: E402


def phase(result: dict, name: str) -> float:
    return sum(p["duration_s"] for p in result["phases"] if p["name"] == name)


def modelled_warmup(config: str, overrides: list[str], policy: str) -> tuple[int, int, int, float]:
    """The warm-up bench would send, timed by the virtual-time simulation: (n, prompt tok, output tok, s) of the short
    batch, the seconds including the first forwards each prefilling server runs alone before it (plan/deadline.py)."""
    from orchestrator.config import load_config
    from orchestrator.plan.deadline import first_forwards_s
    from orchestrator.plan.simulation.simulate import simulate_run
    from orchestrator.workload.batch import warmup_batch

    cfg = load_config(ROOT / config, [*overrides, f"benchmark.warmup.policy={policy}"], paths_from=ROOT)  # as bench reads it
    batch = [(r.prompt_len, r.output_len) for r in warmup_batch(cfg, cfg.benchmark.num_prompts)]
    if not batch:
        return 0, 0, 0, 0.0
    seconds = first_forwards_s(cfg).warm_s + simulate_run(cfg, batch).duration_s
    return len(batch), sum(p for p, _ in batch), sum(o for _, o in batch), seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/default.yaml",
                        help="a relative path is read from the repository root, where bench runs")
    parser.add_argument("--policies", default="none,sglang,dataset")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--modelled-only", action="store_true", help="only the virtual-time table (no Ray runs)")
    parser.add_argument("--out", type=Path, default=None, help="results folder: manifest.json + stdout in output.txt")
    args = parser.parse_args()
    with recorded(args.out):
        print("| warm-up policy | prompts | prompt tokens | output tokens | modelled warm-up s (virtual time) |")
        print("|---|---|---|---|---|")
        for policy in args.policies.split(","):
            n, p, o, s = modelled_warmup(args.config, args.overrides, policy)
            print(f"| {policy} | {n} | {p} | {o} | {s:.2f} |", flush=True)
        print()
        if args.modelled_only:
            return 0
        rows = []
        for policy in args.policies.split(","):
            if policy not in ("none", "sglang", "dataset"):
                raise SystemExit(f"--policies: unknown {policy!r}; choose from none, sglang, dataset")
            run = run_bench_cli(args.config, [*args.overrides, f"benchmark.warmup.policy={policy}"],
                                Path(tempfile.mkdtemp(prefix=f"warmup-{policy}-")))
            r = run.result
            rows.append((policy, r["verdict"], phase(r, "engine start"), phase(r, "warm-up"), phase(r, "measured run"),
                         r["summary"].get("output_throughput", 0.0), first_token_at(run) - job_started_at(run),
                         r["total_s"], r["deadline_s"], r["time_unit"]))
            print(f"{policy}: {r['verdict']} total {r['total_s']:.1f} {r['time_unit']}", file=sys.stderr, flush=True)
        print(f"Warm-up, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.config} {' '.join(args.overrides)}; "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; simulated engine.\n")
        print("| warm-up policy | verdict | engine start | warm-up | measured run | output tok/s | first measured token "
              "| total | deadline | margin | unit |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for policy, verdict, start, warm, measured, tps, ftt, total, deadline, unit in rows:
            print(f"| {policy} | {verdict} | {start:.1f} | {warm:.1f} | {measured:.1f} | {tps:.0f} | {ftt:.1f} | {total:.1f} "
                  f"| {deadline:.0f} | {deadline - total:.1f} | {unit} |")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
