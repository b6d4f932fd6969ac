"""The start-up budget: how long a job may take from Ray bring-up to serve's ready line, from `plan`'s predicted time to
ready; the serve+goodput job's walltime and every SGLang engine's ready timeout are this one number.

Ray bring-up + prepare's part x PREPARE_OVER_PLAN + serve's part x SERVE_OVER_PLAN. prepare's part is plan's cold time to
ready (prepare starts the engines on empty compile caches) + what prepare does after its engines are ready, each priced
by the planner: the warm-up it sends (plan/deadline.py's first forwards with cold caches and its warm-up batch, through
the step model) and stopping the servers and the local cluster (bench's report phase, REPORT_S). serve's part is plan's
warm time to ready (serve starts them on prepare's caches).

The factors are the largest measured/plan of each caches' in-sample start-ups, registered before they were set
(benchmarks/results/2026-11-28-startup-budget-v2-predicted/): the one-H100 lease's two jobs, the two-H200 lease 2's job
and the back-test's start-up rows the planner's terms were set on; benchmarks/startup_budget_oos.py derives them and
sets every other committed real-SGLang start-up against them (benchmarks/results/2026-11-28-startup-budget-v2/). Ray
bring-up is the most it took in the Slurm lab's jobs (benchmarks/results/2026-11-27-startup-budget/bringup.txt).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config import RunConfig
from orchestrator.plan.closedloop.predict import predict_ready

PREPARE_OVER_PLAN = 1.25
SERVE_OVER_PLAN = 1.22
RAY_BRINGUP_S = 28.5
TIMEOUT_FIELD = "engine.sglang.startup_timeout_s"  # set, it replaces the budget as the engines' ready timeout


@dataclass(frozen=True)
class StartupBudget:
    """plan's predicted time to ready for one config (cold and warm compile caches), what prepare adds after its
    engines are ready, and the budget built on them."""

    gpu: str
    cold_plan_s: float
    warm_plan_s: float
    prepare_warmup_s: float = 0.0  # prepare's first forwards (cold caches) and warm-up batch, the planner's step model
    prepare_stop_s: float = 0.0  # stopping the servers and the local cluster: bench's report phase (plan/deadline.py)

    @property
    def prepare_plan_s(self) -> float:
        """prepare's `prepared in` as plan predicts it: the cold time to ready, the warm-up, the stop."""
        return self.cold_plan_s + self.prepare_warmup_s + self.prepare_stop_s

    @property
    def total_s(self) -> float:
        """Whole seconds: Ray bring-up + prepare's part + serve's part."""
        return float(round(RAY_BRINGUP_S + self.prepare_plan_s * PREPARE_OVER_PLAN + self.warm_plan_s * SERVE_OVER_PLAN))

    def parts(self) -> str:
        return (f"Ray bring-up {RAY_BRINGUP_S:g} s measured + plan on {self.gpu}: prepare {self.prepare_plan_s:.0f} s "
                f"(time to ready {self.cold_plan_s:.0f} s cold + warm-up {self.prepare_warmup_s:.1f} s + stop "
                f"{self.prepare_stop_s:.0f} s) x {PREPARE_OVER_PLAN:.2f} + serve {self.warm_plan_s:.0f} s warm x "
                f"{SERVE_OVER_PLAN:.2f}; the factors are the worst measured/plan of the in-sample start-ups")


def prepare_after_ready_s(cfg: RunConfig) -> tuple[float, float]:
    """(warm-up, stop) seconds of prepare after its engines are ready, on cluster.gpu with SGLang: the warm-up as bench's
    deadline prices it with cold caches (its batch is a synthetic stand-in of the run's: the planner needs no dataset
    here, and with outputs capped at benchmark.warmup.max_output_len the step model charges under a second either way),
    the stop as bench's report phase."""
    from orchestrator.plan.deadline import REPORT_S, warmup_batch_shapes, first_forwards_s
    from orchestrator.plan.simulation.runs import batch_shapes
    from orchestrator.plan.simulation.simulate import simulate_run

    gpu = cfg.cluster.gpu
    warm = warmup_batch_shapes(cfg, batch_shapes(cfg, synthetic=True)[0])
    if not warm:
        return 0.0, REPORT_S["sglang"]
    warmup_s = first_forwards_s(cfg, gpu).cold_s + simulate_run(cfg, warm, gpu=gpu).duration_s
    return warmup_s, REPORT_S["sglang"]


def startup_budget(cfg: RunConfig) -> StartupBudget:
    """The budget for cfg on cluster.gpu with SGLang, whatever engine.kind says (a simulated job gets a real budget)."""
    cold = predict_ready(cfg, cfg.cluster.gpu, jit_cached=False).ready_s
    warm = predict_ready(cfg, cfg.cluster.gpu, jit_cached=True).ready_s
    real = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"kind": "sglang"})}) if cfg.simulated else cfg
    return StartupBudget(cfg.cluster.gpu, cold, warm, *prepare_after_ready_s(real))


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
    start may take longer than the job's start-up; a cold start fits it: the budget holds a cold time to ready x
    PREPARE_OVER_PLAN), or the run's deadline where plan cannot price the layout. The simulated engine: the run's
    deadline."""
    if cfg.simulated:
        return ReadyTimeout(cfg.benchmark.deadline_s, f"benchmark.deadline_s {cfg.benchmark.deadline_s:g} s",
                            "benchmark.deadline_s")
    set_s = cfg.engine.sglang.startup_timeout_s
    if set_s is not None:
        return ReadyTimeout(set_s, f"{TIMEOUT_FIELD} {set_s:g} s", TIMEOUT_FIELD)
    from orchestrator.plan.simulation.runs import SimulationError

    try:
        budget = startup_budget(cfg)
    except SimulationError as exc:  # plan cannot price the layout (`--force` on one it says does not fit): the engine
        # still starts, bounded by the run's deadline, not failed in its worker's constructor
        return ReadyTimeout(cfg.benchmark.deadline_s, f"benchmark.deadline_s {cfg.benchmark.deadline_s:g} s (no "
                            f"start-up budget: {exc})", TIMEOUT_FIELD)
    return ReadyTimeout(budget.total_s, f"the start-up budget {budget.total_s:g} s ({budget.parts()})", TIMEOUT_FIELD)
