"""The README's main command against `plan` on the same config: measured (simulated engine) vs modelled throughput.

    .venv/bin/python benchmarks/embedded_vs_plan.py [--config configs/default.yaml] [--set KEY=VALUE ...]
        [--out benchmarks/results/<date>-embedded-vs-plan]

`pd-orchestrator plan --config C` (the CLI, output kept) and the same prediction in-process (plan's batch and
functions) -> `pd-orchestrator bench --config C` exactly as the README runs it (its result.json) -> one table:
both throughputs, measured / plan, run durations, and TTFT (plan, bench's own model of its exact batch, measured). The machine and its load are recorded: `uptime` before and
after, and /proc/loadavg sampled every 5 s while bench runs. With --out, every raw output goes there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.provenance import command_line, cpu_model, write_manifest  # noqa: E402


def cli() -> list[str]:
    """`pd-orchestrator` next to this interpreter (the README's `.venv/bin/pd-orchestrator`)."""
    script = Path(sys.executable).parent / "pd-orchestrator"
    return [str(script)] if script.exists() else [sys.executable, "-m", "orchestrator"]


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


class LoadSampler:
    """/proc/loadavg's 1-minute value every `period_s` while the measured command runs."""

    def __init__(self, period_s: float = 5.0):
        self.period_s = period_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.period_s)

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> str:
        if not self.samples:
            return "no samples"
        s = self.samples
        return f"min {min(s):.1f}, mean {sum(s) / len(s):.1f}, max {max(s):.1f} ({len(s)} samples)"


def plan_prediction(config: str, overrides: list[str]) -> dict:
    """What `plan` prints for the run phase, computed by the same functions on the same batch."""
    from orchestrator.config import load_config
    from orchestrator.plan.deadline import predict_deadline
    from orchestrator.plan.simulation.simulate import batch_shapes

    from orchestrator.stats import percentile
    from orchestrator.run.bench import max_in_flight
    from orchestrator.run.fidelity import modelled_run
    from orchestrator.workload.batch import sample_batch as bench_batch

    cfg = load_config(ROOT / config, overrides, paths_from=ROOT)  # as bench reads it (run from the repository root)
    batch, source = batch_shapes(cfg)
    budget = predict_deadline(cfg, batch, gpu=cfg.cluster.gpu)
    run = budget.run
    # bench's own model: the exact batch bench sends, in its order and under its admission limit
    sent = bench_batch(cfg, cfg.benchmark.num_prompts)
    own = modelled_run(cfg, [(r.prompt_len, r.output_len) for r in sent], max_in_flight(cfg, len(sent)))
    return {
        "ttft_p50_s": percentile(run.ttft_s, 50),
        "ttft_p90_s": percentile(run.ttft_s, 90),
        "bench_model": None if own is None else {
            "run_s": own.duration_s, "output_throughput": own.output_throughput,
            "ttft_p50_s": percentile(own.ttft_s, 50), "ttft_p90_s": percentile(own.ttft_s, 90),
        },
        "batch_source": source,
        "prompts": run.num_requests,
        "run_s": run.duration_s,
        "output_throughput": run.output_throughput,
        "total_throughput": run.total_throughput,
        "total_s": budget.total_s,
        "verdict": budget.verdict,
        "gpu": run.gpu,
    }


def run_logged(argv: list[str], log: Path, env: dict[str, str]) -> tuple[int, str, float]:
    started = time.monotonic()
    with open(log, "w") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        code = subprocess.run(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    return code, log.read_text(errors="replace"), time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/default.yaml",
                        help="a relative path is read from the repository root, where bench runs")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", help="directory for the raw outputs (default: a temp dir)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="embedded-vs-plan-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    write_manifest(out, command_line())
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"))
    sets = [a for o in args.overrides for a in ("--set", o)]

    machine = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "uptime_before": uptime(),
    }
    plan_argv = [*cli(), "plan", "--config", args.config, *sets]
    plan_code, _, _ = run_logged(plan_argv, out / "plan-output.txt", env)
    plan = plan_prediction(args.config, args.overrides)

    bench_argv = [*cli(), "bench", "--config", args.config, *sets, "--result-dir", str(out / "runs")]
    with LoadSampler() as load:
        bench_code, bench_text, bench_wall = run_logged(bench_argv, out / "bench-output.txt", env)
    machine["uptime_after"] = uptime()
    machine["load_during_bench"] = load.summary()
    results = sorted((out / "runs").rglob("result.json"), key=lambda p: p.stat().st_mtime)
    if not results:
        print(f"bench wrote no result.json (exit {bench_code}); output:\n{bench_text[-3000:]}", file=sys.stderr)
        return 1
    result = json.loads(results[-1].read_text())
    summary = result["summary"]
    measured = {
        "verdict": result["verdict"],
        "run_s": result["duration_s"],
        "total_s": result["total_s"],
        "output_throughput": summary["output_throughput"],
        "total_throughput": summary["total_throughput"],
        "completed": result["counts"]["completed"],
        "simulation": result.get("simulation"),
        "ttft": result.get("latency", {}).get("ttft"),
        "result_json": str(results[-1]),
    }
    record = {"config": args.config, "overrides": args.overrides, "machine": machine,
              "commands": {"plan": shlex.join(plan_argv), "bench": shlex.join(bench_argv)},
              "exit_codes": {"plan": plan_code, "bench": bench_code}, "bench_wall_s": bench_wall,
              "plan": plan, "measured": measured}
    (out / "embedded-vs-plan.json").write_text(json.dumps(record, indent=1))

    def ratio(key: str) -> str:
        return f"{measured[key] / plan[key]:.3f}" if plan[key] else "n/a"

    print(f"Embedded default vs plan, {machine['date_utc']}, {args.config} {' '.join(args.overrides)}")
    print(f"machine: {machine['host']}, {machine['cores']} cores ({machine['cpu']})")
    print(f"uptime before: {machine['uptime_before']}")
    print(f"uptime after:  {machine['uptime_after']}")
    print(f"load (1-min) during bench: {machine['load_during_bench']}\n")
    print("| | run s | output tok/s | total tok/s | verdict |")
    print("|---|---:|---:|---:|---|")
    print(f"| plan (modelled, {plan['gpu']}, {plan['prompts']} prompts, {plan['batch_source']}) | {plan['run_s']:.1f} "
          f"| {plan['output_throughput']:,.0f} | {plan['total_throughput']:,.0f} | {plan['verdict']} (total {plan['total_s']:.0f} s) |")
    print(f"| bench (README main command, measured) | {measured['run_s']:.1f} | {measured['output_throughput']:,.0f} "
          f"| {measured['total_throughput']:,.0f} | {measured['verdict']} (total {measured['total_s']:.0f} s) |")
    print(f"| measured / plan | {measured['run_s'] / plan['run_s']:.3f} | {ratio('output_throughput')} "
          f"| {ratio('total_throughput')} | |")
    own, ttft = plan.get("bench_model"), measured.get("ttft") or {}
    if own:
        print(f"| bench's own model of its exact batch | {own['run_s']:.1f} | {own['output_throughput']:,.0f} | | |")
    print("\n| TTFT (s) | p50 | p90 |\n|---|---:|---:|")
    print(f"| plan | {plan['ttft_p50_s']:.2f} | {plan['ttft_p90_s']:.2f} |")
    if own:
        print(f"| bench's own model | {own['ttft_p50_s']:.2f} | {own['ttft_p90_s']:.2f} |")
    if ttft.get("p50") is not None:
        print(f"| measured (simulated engine) | {ttft['p50']:.2f} | {ttft['p90']:.2f} |")
    if measured["simulation"]:
        print(f"\nbench's own fidelity record: {json.dumps(measured['simulation'])}")
    print(f"\nraw outputs: {out}")
    return 0 if bench_code == 0 and plan_code in (0, 1) else 1


if __name__ == "__main__":
    raise SystemExit(main())
