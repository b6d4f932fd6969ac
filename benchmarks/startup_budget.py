"""The serve+goodput job's start-up factors: each start-up step as measured over what `plan` predicts for it.

The one-H100 Qwen3 lease (benchmarks/results/2026-11-26-qwen3-serve-one-h100, two fresh machines) measured `prepare`
(engines started on empty compile caches, then its warm-up batch: `prepared in`) and `serve` on the prepared caches
(`workers ready in`). `plan` predicts, for the same config, the time to ready with cold and with warm caches. The worst
ratio of each step over the two runs is what orchestrator/cli/jobscript.py scales the plan's prediction by for a
job's default start-up budget (in-sample: these are the only runs).

    .venv/bin/python benchmarks/startup_budget.py
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.config import load_config  # noqa: E402
from orchestrator.plan.closedloop.predict import predict_ready  # noqa: E402

LEASE = ROOT / "benchmarks" / "results" / "2026-11-26-qwen3-serve-one-h100"
CONFIG = ROOT / "configs" / "device-h100x1-qwen3-serve.yaml"
# (run, prepare's output, serve's output), as the lease's README pairs them
RUNS = (("run 1 (calls 8, 9)", "prepare.txt", "serve.txt"), ("run 2 (calls 14, 15)", "prepare-run2.txt", "serve-run2.txt"))


def measured_s(path: Path, pattern: str) -> float:
    match = re.search(pattern, path.read_text())
    if match is None:
        raise SystemExit(f"{path}: no line matching {pattern!r}")
    return float(match.group(1))


def step_ratios() -> dict[str, list[tuple[str, float, float]]]:
    """{"prepare": [(run, measured s, plan s)], "serve": [...]} against today's plan for CONFIG."""
    cfg = load_config(CONFIG)
    cold = predict_ready(cfg, cfg.cluster.gpu, jit_cached=False).ready_s
    warm = predict_ready(cfg, cfg.cluster.gpu, jit_cached=True).ready_s
    out: dict[str, list[tuple[str, float, float]]] = {"prepare": [], "serve": []}
    for run, prepare, serve in RUNS:
        out["prepare"].append((run, measured_s(LEASE / prepare, r"prepared in ([\d.]+) s"), cold))
        out["serve"].append((run, measured_s(LEASE / serve, r"workers ready in ([\d.]+) s"), warm))
    return out


def worst_ratio(rows: list[tuple[str, float, float]]) -> float:
    """The largest measured/plan ratio, rounded up to 0.01 (the factor a budget uses)."""
    return max(math.ceil(round(m / p, 6) * 100) / 100 for _, m, p in rows)


def main() -> None:
    ratios = step_ratios()
    print(f"config {CONFIG.relative_to(ROOT)}; plan: predict_ready (prepare = cold compile caches, serve = warm)")
    print(f"{'step':<8} {'run':<22} {'measured s':>10} {'plan s':>8} {'measured/plan':>13}")
    for step, rows in ratios.items():
        for run, m, p in rows:
            print(f"{step:<8} {run:<22} {m:>10.1f} {p:>8.1f} {m / p:>13.3f}")
    for step, rows in ratios.items():
        print(f"{step}: worst measured/plan {worst_ratio(rows):.2f} (in-sample, {len(rows)} runs)")


if __name__ == "__main__":
    main()
