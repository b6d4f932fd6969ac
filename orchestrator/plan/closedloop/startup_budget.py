"""The start-up budget: how long a job may take from Ray bring-up to serve's ready line, from `plan`'s predicted time to
ready; the serve+goodput job's walltime and every SGLang engine's ready timeout are this one number.

Ray bring-up + plan's cold time to ready x PREPARE_OVER_PLAN (prepare starts the engines on empty compile caches) +
plan's warm time to ready x SERVE_OVER_PLAN (serve starts them on prepare's caches). The factors are the worst
measured/plan ratio of each step over the one-H100 Qwen3 lease's two runs (in-sample: benchmarks/startup_budget.py ->
benchmarks/results/2026-11-27-startup-budget/output.txt); Ray bring-up is the most it took in the Slurm lab's jobs (same
folder, bringup.txt). Out of sample, 22 of 33 start-ups overran their part and every two-H200 job its two parts together;
no start-up on record took longer than the whole budget of its config (benchmarks/startup_budget_oos.py,
benchmarks/results/2026-11-27-startup-budget-oos/).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config import RunConfig
from orchestrator.plan.closedloop.predict import predict_ready

PREPARE_OVER_PLAN = 1.10
SERVE_OVER_PLAN = 1.00
RAY_BRINGUP_S = 28.5
TIMEOUT_FIELD = "engine.sglang.startup_timeout_s"  # set, it replaces the budget as the engines' ready timeout


@dataclass(frozen=True)
class StartupBudget:
    """plan's predicted time to ready for one config (cold and warm compile caches) and the budget built on it."""

    gpu: str
    cold_plan_s: float
    warm_plan_s: float

    @property
    def total_s(self) -> float:
        """Whole seconds: Ray bring-up + prepare's part + serve's part."""
        return float(round(RAY_BRINGUP_S + self.cold_plan_s * PREPARE_OVER_PLAN + self.warm_plan_s * SERVE_OVER_PLAN))

    def parts(self) -> str:
        return (f"Ray bring-up {RAY_BRINGUP_S:g} s measured + plan's time to ready on {self.gpu}: prepare "
                f"{self.cold_plan_s:.0f} s cold x {PREPARE_OVER_PLAN:.2f} + serve {self.warm_plan_s:.0f} s warm x "
                f"{SERVE_OVER_PLAN:.2f}, the worst measured/plan of 2 one-H100 runs")


def startup_budget(cfg: RunConfig) -> StartupBudget:
    """The budget for cfg on cluster.gpu with SGLang, whatever engine.kind says (a simulated job gets a real budget)."""
    cold = predict_ready(cfg, cfg.cluster.gpu, jit_cached=False).ready_s
    warm = predict_ready(cfg, cfg.cluster.gpu, jit_cached=True).ready_s
    return StartupBudget(cfg.cluster.gpu, cold, warm)


@dataclass(frozen=True)
class ReadyTimeout:
    """How long one engine may take to become ready, and what set it (for the one-line error at timeout)."""

    seconds: float
    source: str  # "start-up budget 949 s (...)", "engine.sglang.startup_timeout_s 300 s", "benchmark.deadline_s ..."
    field: str  # the config field that raises it

    def error(self, server: str, phase: str, log_path: str) -> str:
        """The one line a server that ran out of this timeout fails with."""
        return (f"{server}: engine not ready after {self.seconds:.0f} s, {self.source}; it was {phase} (log "
                f"{log_path}); raise {self.field} (--set {self.field}=SECONDS)")


def engine_ready_timeout(cfg: RunConfig) -> ReadyTimeout:
    """A real SGLang engine: engine.sglang.startup_timeout_s when set, else the whole start-up budget (no single engine
    start may take longer than the job's start-up; a cold start fits it: the budget holds a cold time to ready x 1.10).
    The simulated engine: the run's deadline."""
    if cfg.simulated:
        return ReadyTimeout(cfg.benchmark.deadline_s, f"benchmark.deadline_s {cfg.benchmark.deadline_s:g} s",
                            "benchmark.deadline_s")
    set_s = cfg.engine.sglang.startup_timeout_s
    if set_s is not None:
        return ReadyTimeout(set_s, f"{TIMEOUT_FIELD} {set_s:g} s", TIMEOUT_FIELD)
    budget = startup_budget(cfg)
    return ReadyTimeout(budget.total_s, f"the start-up budget {budget.total_s:g} s ({budget.parts()})", TIMEOUT_FIELD)
