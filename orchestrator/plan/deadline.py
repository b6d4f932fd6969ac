"""Deadline preflight: predict every phase of a run against benchmark.deadline_s, before any bring-up.

config + batch -> placement (Ray) -> engine_start (weights from dummy/disk, CUDA graphs, JIT; servers
start in parallel, the slowest counts) -> warmup (simulated) -> run (simulate.py on the actual batch)
-> report -> DeadlineBudget with a VALID / at-risk / INVALID verdict. Phase names are the bench driver's
(orchestrator.phases.Phase values; `projected_finish_s` also takes its titles such as 'engine start'), so
it can feed the driver's live projected-finish gauge.

For the sim engine the prediction is of this machine's wall time: the simulated engine sleeps the cost
model's durations x engine.sim.time_scale. Every number is labelled simulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from orchestrator.config import RunConfig
from orchestrator.phases import BEFORE_PLACEMENT
from orchestrator.phases import Phase
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.plan.simulation.simulate import LABEL, SimulatedRun, simulate_run
from orchestrator.records import Role
from orchestrator.workload.batch import bench_first_forwards

VALID = "VALID"
AT_RISK = "at-risk"
INVALID = "INVALID"

# Fixed costs outside the engines (docs/planning.md): Ray placement groups and actor start on a running cluster (15 s:
# the two bench runs on a cluster already up took 13.6 / 16.4 s, below).
# Report (results, plots, metrics scrape, stopping the servers): the 15 SGLang bench runs on lent GPUs that exited 0
# spent a median 22.0 s (15.6-23.4) from the measured run's end to bench's exit, about 4 s results, plots and scrape
# and the rest stopping SGLang and Ray (benchmarks/report_phase.py, raw output benchmarks/results/2026-11-27-report-phase/).
# The simulated engine runs where bench runs, on this project's 2-core machines (developers' and CI's): its placement
# on a cluster already up is Serve's start and the replicas' processes (the sim servers launched from them), the
# median of 3 bench runs there, 15.1-19.0 s (benchmarks/placement_steps.py --running-cluster).
PLACEMENT_S = {"sglang": 15.0, "sim": 17.4}
# A local cluster the run starts itself (cluster.address: local): Ray's head and worker raylets start, one after the
# other, before the driver attaches and Serve starts. A property of the host, not the GPU. SGLang: the median "Phase
# placement" of the 13 `bench` runs through the product's local cluster on lent H100 / H200 machines (16-32 cores)
# (28.5-42.5 s; on a cluster already up: 13.6 / 16.4 s, the 15 s above): benchmarks/qwen3_startup_phases.py,
# benchmarks/results/2026-11-26-qwen3-startup-phases/. The simulated engine: the median of 5 bench runs of the
# embedded default on the 2-core machine, each starting its own cluster (benchmarks/placement_steps.py), at a 1-minute
# load of 4.9-6.6 (the box shared by other work, as it was for the README's first command's 49.7 s): the load
# stretches every step, so an idle box places faster than this.
LOCAL_CLUSTER_PLACEMENT_S = {"sglang": 37.3, "sim": 46.0}
PLACEMENT_SOURCE = {
    "sglang": "median of 13 bench runs on lent GPU hosts, 28.5-42.5 s",
    "sim": "median of 5 bench runs on a shared 2-core box, 29.5-55.3 s; "
           "benchmarks/results/2026-11-27-sim-placement-steps/",
}
REPORT_S = {"sglang": 22.0, "sim": 1.0}
# SGLang's `--warmup` shape (16 random prompts of 256 in / 16 out), from bench_serving.
SGLANG_WARMUP_SHAPE = (256, 16)
# Below deadline x (1 - margin) the run is VALID; up to the deadline it is at risk.
DEFAULT_MARGIN = 0.1


@dataclass
class PhaseEstimate:
    """One phase of the budget: its name (a Phase value), predicted seconds and what they are made of."""

    name: str
    predicted_s: float
    detail: str


@dataclass
class DeadlineBudget:
    """Predicted phases, their sum and the verdict against the deadline (all numbers simulated)."""

    deadline_s: float
    phases: list[PhaseEstimate]
    run: SimulatedRun
    margin: float = DEFAULT_MARGIN
    startup_by_server: dict[str, float] = field(default_factory=dict)
    label: str = LABEL
    engine_start_cold_s: float | None = None
    engine_start_warm_s: float | None = None
    caches: str = "warm"  # which of the two the engine_start and warmup phases use
    warmup_compile_s: float = 0.0  # what cold caches add to the warm-up: its first prompt forwards' compile

    @property
    def total_s(self) -> float:
        return sum(p.predicted_s for p in self.phases)

    @property
    def startup_s(self) -> float:
        return sum(p.predicted_s for p in self.phases if p.name in (Phase.PLACEMENT, Phase.ENGINE_START, Phase.WARMUP))

    @property
    def verdict(self) -> str:
        if self.total_s <= self.deadline_s * (1 - self.margin):
            return VALID
        return AT_RISK if self.total_s <= self.deadline_s else INVALID

    def phase_s(self, name: str) -> float:
        return next((p.predicted_s for p in self.phases if p.name == name), 0.0)

    def table(self) -> str:
        rows = [f"{'phase':<13} {'predicted s':>11} {'cumulative':>10}  detail ({self.label})"]
        cumulative = 0.0
        for p in self.phases:
            cumulative += p.predicted_s
            rows.append(f"{p.name:<13} {p.predicted_s:>11.1f} {cumulative:>10.1f}  {p.detail}")
        slack = self.deadline_s - self.total_s
        if self.engine_start_cold_s is not None and self.engine_start_warm_s is not None:
            other = "cold" if self.caches == "warm" else "warm"
            other_s = self.engine_start_cold_s if other == "cold" else self.engine_start_warm_s
            why = (
                "--jit-cold: fresh nodes, empty Triton/DeepGEMM/graph caches" if self.caches == "cold"
                else "compile caches assumed warm, e.g. after an earlier run on the same nodes; --jit-cold for fresh ones"
            )
            compile_s = self.warmup_compile_s if other == "cold" else -self.warmup_compile_s
            rows.append(
                f"{'engine start':<13} cold {self.engine_start_cold_s:.0f} s / warm {self.engine_start_warm_s:.0f} s"
                + (f" (cold caches: + {self.warmup_compile_s:.0f} s first-forward compile in warm-up)"
                   if self.warmup_compile_s >= 0.5 else "")
                + f"; applies: {self.caches} ({why}); with {other} caches the total is "
                f"{self.total_s - self.phase_s('engine_start') + other_s + compile_s:.0f} s"
            )
        rows.append(
            f"{'total':<13} {self.total_s:>11.1f} {'':>10}  deadline {self.deadline_s:.0f} s, "
            f"slack {slack:+.1f} s -> {self.verdict}"
        )
        return "\n".join(rows)


def cluster_start_s(cfg: RunConfig) -> float:
    """What starting the local cluster adds to placement, when the run starts one (cluster.address: local;
    `prepare` starts it for its node checks, so its compile step's "ready after" holds none of it)."""
    kind = cfg.engine.kind
    return LOCAL_CLUSTER_PLACEMENT_S[kind] - PLACEMENT_S[kind] if cfg.cluster.is_local else 0.0


def placement_s(cfg: RunConfig) -> float:
    """Seconds from launch to placed worker actors: Ray placement groups and actors, after the cluster's own start
    when the run starts a local one."""
    return PLACEMENT_S[cfg.engine.kind] + cluster_start_s(cfg)


def warmup_batch_shapes(cfg: RunConfig, batch: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The warm-up's short prompts, which bench sends through the router after the first forwards."""
    warmup = cfg.benchmark.warmup
    if warmup.policy == "none":
        return []
    if warmup.policy == "sglang":
        return [SGLANG_WARMUP_SHAPE] * warmup.num_prompts
    cap = getattr(warmup, "max_output_len", None)  # bench caps warm-up outputs (benchmark.warmup.max_output_len)
    # bench's warm-up prompts are another seed's sample (workload/batch.py warmup_batch), not the batch's first ones:
    # stand in with the batch's size quantiles, which do not depend on the order the batch is sent in
    n = min(warmup.num_prompts, len(batch))
    by_size = sorted(batch, key=lambda shape: (shape[0] + shape[1], shape))
    picked = [by_size[(2 * i + 1) * len(by_size) // (2 * n)] for i in range(n)]
    return [(p, min(o, cap) if cap else o) for p, o in picked]


@dataclass(frozen=True)
class FirstForwards:
    """Modelled seconds of bench's first-forward warm-up with warm and with cold compile caches."""

    warm_s: float
    cold_s: float

    def scaled(self, factor: float) -> FirstForwards:
        return FirstForwards(self.warm_s * factor, self.cold_s * factor)


def first_forwards_s(cfg: RunConfig, gpu: str | None = None) -> FirstForwards:
    """Modelled seconds of bench's first-forward warm-up (run/bench_warmup.py): every prefilling server takes its
    long prompt alone, once per DP rank, one answered before the next; servers in parallel, so the slowest group's
    ranks x one prompt through a layout holding only that group's one server (and, PD, the decodes).

    On cold caches each rank's prompt (one full chunk, then its remainder) also pays the compile a real server
    without decode graphs meets at its first prompt forwards (StartupTerms.first_prompt_compile_s); the prompt is
    simulated once for both figures (plan --search asks for them per candidate)."""
    slowest_warm = slowest_cold = 0.0
    for f in bench_first_forwards(cfg):
        group = getattr(cfg.layout, f.role)[f.group_index].model_copy(update={"count": 1})
        alone = cfg.model_copy(update={"layout": cfg.layout.model_copy(update={f.role: [group]})})
        one = simulate_run(alone, [(f.prompt_len, cfg.benchmark.warmup.max_output_len)], gpu=gpu, max_concurrency=None)
        compile_s = 0.0
        if cfg.engine.kind == "sglang":  # the simulated engine compiles nothing
            compile_s = cost_model_for(cfg, cast(Role, f.role), group, gpu=gpu).first_prompt_compile_s(jit_cached=False)
        slowest_warm = max(slowest_warm, f.ranks * one.duration_s)
        slowest_cold = max(slowest_cold, f.ranks * (one.duration_s + compile_s))
    return FirstForwards(slowest_warm, slowest_cold)


def engine_start_s(
    cfg: RunConfig,
    gpu: str | None = None,
    disk_gb_s: float = 2.0,
    jit_cached: bool = True,
    sglang_version: str | None = None,
) -> tuple[float, dict[str, float], str]:
    """(slowest server's start-up, start-up per group, detail) -- servers start in parallel.

    jit_cached: warm compile caches (Triton, DeepGEMM, CUDA-graph kernels) on every node; False = a fresh
    machine, where every graph batch size and the first forwards compile their kernels."""
    kind = cfg.engine.kind
    load_format = cfg.engine.sglang.load_format
    per_group: dict[str, float] = {}
    slowest_detail = ""
    for role, i, group in cfg.layout.groups():
        model = cost_model_for(cfg, role, group, gpu=gpu, sglang_version=sglang_version)
        if kind == "sim" and cfg.engine.sim.startup_s is not None:
            seconds, detail = cfg.engine.sim.startup_s, "engine.sim.startup_s"
        else:
            parts = model.startup_breakdown_s(load_format, disk_gb_s, jit_cached)
            seconds = sum(parts.values())
            source = "dummy weights" if load_format == "dummy" else f"weights from disk at {disk_gb_s:g} GB/s"
            graphs = len(model.graph_batch_sizes())
            source += f", {graphs} graph batch sizes" if graphs else ", no decode graphs"
            source += ", " + (model.calibration.profile if model.calibration else "no calibration profile")
            detail = ", ".join(f"{k} {v:.0f}" for k, v in parts.items() if v >= 0.5) + f" ({source})"
        if kind == "sim":
            seconds *= cfg.engine.sim.time_scale
        per_group[f"{role}.{i}"] = seconds
        if seconds >= max(per_group.values()):
            slowest_detail = f"slowest {role}.{i}: {detail}"
    return max(per_group.values()), per_group, slowest_detail


def predict_deadline(
    cfg: RunConfig,
    batch: Sequence[tuple[int, int]],
    gpu: str | None = None,
    disk_gb_s: float = 2.0,
    jit_cached: bool = True,
    margin: float = DEFAULT_MARGIN,
    run: SimulatedRun | None = None,
) -> DeadlineBudget:
    """Budget of every phase for `batch` on cfg's layout; GPU = `gpu`, else what the engine runs as.

    jit_cached picks which engine start the phases use (warm or cold compile caches); both are kept."""
    kind = cfg.engine.kind
    gpu = gpu or (cfg.sim_profile if kind == "sim" else cfg.cluster.gpu)
    scale = cfg.engine.sim.time_scale if kind == "sim" else 1.0
    start_s, per_group, start_detail = engine_start_s(cfg, gpu, disk_gb_s, jit_cached)
    other_start_s = engine_start_s(cfg, gpu, disk_gb_s, not jit_cached)[0]
    cold_s, warm_start_s = (other_start_s, start_s) if jit_cached else (start_s, other_start_s)
    warm = warmup_batch_shapes(cfg, batch)
    first = first_forwards_s(cfg, gpu).scaled(scale) if warm else FirstForwards(0.0, 0.0)
    first_warm_s, first_cold_s = first.warm_s, first.cold_s
    first_s = first_warm_s if jit_cached else first_cold_s
    warm_s = first_s + (simulate_run(cfg, warm, gpu=gpu).duration_s * scale if warm else 0.0)
    run = run or simulate_run(cfg, batch, gpu=gpu)
    phases = [
        PhaseEstimate(Phase.PLACEMENT.value, placement_s(cfg), "Ray placement groups + worker actors"
                      + (f" after starting the local cluster ({PLACEMENT_SOURCE[kind]})" if cluster_start_s(cfg)
                         else "")),
        PhaseEstimate(Phase.ENGINE_START.value, start_s, start_detail),
        PhaseEstimate(Phase.WARMUP.value, warm_s, f"{cfg.benchmark.warmup.policy}: {len(warm)} prompts"
                      + (f" after each server's first forward alone ({first_s:.1f} s" if first_s else "")
                      + (f", {first_s - first_warm_s:.1f} of it cold compile)" if first_s > first_warm_s
                         else ")" if first_s else "")),
        PhaseEstimate(
            Phase.RUN.value,
            run.duration_s * scale,
            f"{run.num_requests} prompts, {run.output_throughput:,.0f} out tok/s on {gpu}",
        ),
        PhaseEstimate(Phase.REPORT.value, REPORT_S[kind], "results, logs, stop servers"),
    ]
    return DeadlineBudget(
        cfg.benchmark.deadline_s, phases, run, margin, per_group,
        engine_start_cold_s=cold_s, engine_start_warm_s=warm_start_s, caches="warm" if jit_cached else "cold",
        warmup_compile_s=first_cold_s - first_warm_s,
    )


def projected_finish_s(
    budget: DeadlineBudget,
    elapsed_s: float,
    phase: str,
    phase_started_s: float,
    done_output_tokens: int = 0,
    total_output_tokens: int = 0,
) -> float:
    """Projected job finish (s from job start) while in `phase`: measured so far + predicted rest.

    The current phase counts as its prediction, or as done-by-now once it overruns it; in the run phase
    the measured token rate takes over from the prediction in proportion to the share of tokens done.
    """
    names = [p.name for p in budget.phases]
    try:
        bench_phase = Phase.of(phase)  # the budget label or the driver's title ('engine start')
    except ValueError:
        raise ValueError(f"unknown phase {phase!r}; expected one of {names}, their bench titles, or 'done'") from None
    if bench_phase is Phase.DONE:
        return elapsed_s
    if bench_phase in BEFORE_PLACEMENT:  # nothing predicted has started yet (counted in placement)
        return elapsed_s + budget.total_s
    phase = bench_phase.value
    if phase not in names:
        raise ValueError(f"unknown phase {phase!r}; expected one of {names}, their bench titles, or 'done'")
    in_phase_s = max(0.0, elapsed_s - phase_started_s)
    predicted = budget.phase_s(phase)
    remaining = max(0.0, predicted - in_phase_s)
    if phase == Phase.RUN and total_output_tokens > 0 and done_output_tokens > 0:
        share = min(1.0, done_output_tokens / total_output_tokens)
        measured_remaining = in_phase_s * (1 - share) / share
        remaining = share * measured_remaining + (1 - share) * remaining
    later = sum(p.predicted_s for p in budget.phases[names.index(phase) + 1 :])
    return elapsed_s + remaining + later
