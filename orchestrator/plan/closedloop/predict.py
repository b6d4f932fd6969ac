"""`plan` for a closed-loop workload: per declared N, output and good output tok/s, good fraction, TTFT and ITL
p50/p90/p99 and the SLA gate; the largest N that clears it, the best point, and the predicted time to ready.

config (benchmark.kind closed_loop: ISL, OSL, N list, window, grace, slo) -> one simulated window per N
(client.py) -> ClosedLoopPoint rows -> a table for people and `as_json` rows for tools (the same keys as
`goodput.json`'s rows, so predicted and measured line up). Every number here is simulated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.config import RunConfig
from orchestrator.config.benchmark import SloConfig
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.weights import DUMMY_GREEDY_CYCLE_TOKENS
from orchestrator.plan.closedloop.client import ClosedLoopLoad, ClosedLoopRun, simulate_closed_loop
from orchestrator.plan.deadline import PLACEMENT_S, cluster_start_s, engine_start_s
from orchestrator.plan.simulation.runs import LABEL
from orchestrator.plan.simulation.simulate import shared_gpu_groups, simulate_run

PASS, FAIL = "PASS", "FAIL"


@dataclass
class ClosedLoopPoint:
    """One declared concurrency N: its simulated window scored under the SLO."""

    concurrency: int
    run: ClosedLoopRun
    slo: SloConfig

    @property
    def output_tok_s(self) -> float:
        return self.run.output_tok_s

    @property
    def good_output_tok_s(self) -> float:
        return self.run.good_output_tok_s(self.slo)

    @property
    def good_fraction(self) -> float:
        return self.run.good_fraction(self.slo)

    @property
    def clears_gate(self) -> bool:
        return bool(self.run.requests) and self.good_fraction >= self.slo.min_good_fraction

    def as_json(self) -> dict:
        return {"concurrency": self.concurrency, "output_tok_s": self.output_tok_s,
                "good_output_tok_s": self.good_output_tok_s, "good_fraction": self.good_fraction,
                "ttft_ms": self.run.ttft_ms(), "itl_ms": self.run.itl_ms(), "requests": len(self.run.requests),
                "not_counted": self.run.not_counted, "clears_gate": self.clears_gate}


def best_point(points: Sequence[ClosedLoopPoint]) -> ClosedLoopPoint | None:
    """The scoring point: the most good output tok/s among the N that clear the gate (None: no N clears it)."""
    passing = [p for p in points if p.clears_gate]
    return max(passing, key=lambda p: p.good_output_tok_s) if passing else None


@dataclass(frozen=True)
class ReadyEstimate:
    """Predicted seconds from launch to the ready line: placement, engine start (warm or cold compile caches),
    one warm-up request through every prefill-decode pair."""

    placement_s: float
    engine_start_warm_s: float
    engine_start_cold_s: float
    pair_warmup_s: float
    pairs: int
    jit_cached: bool
    where: str = ""  # the GPU and weights the engine start was predicted for, e.g. "H100-SXM, SGLang, dummy weights"
    cluster_start_s: float = 0.0  # the part of placement_s that starts the local cluster (deadline.cluster_start_s)

    @property
    def ready_s(self) -> float:
        start = self.engine_start_warm_s if self.jit_cached else self.engine_start_cold_s
        return self.placement_s + start + self.pair_warmup_s

    def line(self) -> str:
        caches = "warm" if self.jit_cached else "cold"
        other = self.engine_start_cold_s if self.jit_cached else self.engine_start_warm_s
        where = f" on {self.where}" if self.where else ""
        cluster = f" incl. {self.cluster_start_s:.0f} s starting the local cluster" if self.cluster_start_s else ""
        return (f"predicted time to ready{where}: {self.ready_s:.0f} s (placement {self.placement_s:.0f} s{cluster} + engine start "
                f"{self.ready_s - self.placement_s - self.pair_warmup_s:.0f} s with {caches} compile caches "
                f"[{'cold' if self.jit_cached else 'warm'}: {other:.0f} s] + {self.pairs} pair warm-up(s) "
                f"{self.pair_warmup_s:.2f} s; a cold NIXL pair's first-request stall, tens of seconds on "
                "InfiniBand, is not modelled)")

    def as_json(self) -> dict:
        return {"ready_s": self.ready_s, "placement_s": self.placement_s, "engine_start_warm_s": self.engine_start_warm_s,
                "engine_start_cold_s": self.engine_start_cold_s, "pair_warmup_s": self.pair_warmup_s,
                "cluster_start_s": self.cluster_start_s,
                "jit_cached": self.jit_cached}


@dataclass
class ClosedLoopPrediction:
    layout: str
    gpu: str
    load: ClosedLoopLoad  # its concurrency is the first point's; each point has its own
    slo: SloConfig
    points: list[ClosedLoopPoint]
    ready: ReadyEstimate
    label: str = LABEL

    @property
    def best(self) -> ClosedLoopPoint | None:
        return best_point(self.points)

    @property
    def largest_passing(self) -> int | None:
        return max((p.concurrency for p in self.points if p.clears_gate), default=None)

    def table(self) -> str:
        def q(d: dict[str, float]) -> str:
            return "/".join("nan" if math.isnan(d[k]) else f"{d[k]:.0f}" for k in ("p50", "p90", "p99"))

        def q1(d: dict[str, float]) -> str:
            return "/".join("nan" if math.isnan(d[k]) else f"{d[k]:.1f}" for k in ("p50", "p90", "p99"))

        rows = [f"{'N':>5} {'out tok/s':>10} {'good tok/s':>10} {'good frac':>9} {'TTFT p50/p90/p99 ms':>21} "
                f"{'ITL p50/p90/p99 ms':>19} {'requests':>8}  gate ({self.label})"]
        for p in self.points:
            rows.append(f"{p.concurrency:>5} {p.output_tok_s:>10,.0f} {p.good_output_tok_s:>10,.0f} "
                        f"{p.good_fraction:>9.3f} {q(p.run.ttft_ms()):>21} {q1(p.run.itl_ms()):>19} "
                        f"{len(p.run.requests):>8}  {PASS if p.clears_gate else FAIL}")
        return "\n".join(rows)

    def verdict(self) -> str:
        best, gate = self.best, f"good fraction >= {self.slo.min_good_fraction:.2f}"
        if best is None:
            return (f"no N clears the gate ({gate} with TTFT <= {self.slo.ttft_ms:g} ms and ITL <= {self.slo.itl_ms:g} ms); "
                    "lower the concurrency or try `plan --search`")
        return (f"largest N clearing the gate ({gate}): {self.largest_passing}; best: {best.good_output_tok_s:,.0f} "
                f"good output tok/s at N={best.concurrency} ({self.label})")

    def as_json(self, error_band: str) -> dict:
        best = self.best
        return {"label": self.label, "layout": self.layout, "gpu": self.gpu,
                "input_tokens": self.load.input_tokens, "output_tokens": self.load.output_tokens,
                "window_s": self.load.window_s, "grace_s": self.load.grace_s, "slo": self.slo.model_dump(),
                "rows": [p.as_json() for p in self.points],
                "best": None if best is None else {"concurrency": best.concurrency,
                                                   "good_output_tok_s": best.good_output_tok_s},
                "largest_passing_concurrency": self.largest_passing,
                "time_to_ready": self.ready.as_json(), "error_band": error_band}


def predict_ready(cfg: RunConfig, gpu: str, disk_gb_s: float = 2.0, jit_cached: bool = True) -> ReadyEstimate:
    """Launch to ready on `gpu` (real seconds: the simulated engine's time scale is not applied)."""
    real = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"kind": "sglang"})}) if cfg.simulated else cfg
    warm = engine_start_s(real, gpu, disk_gb_s, jit_cached=True)[0]
    cold = engine_start_s(real, gpu, disk_gb_s, jit_cached=False)[0]
    layout = cfg.layout
    if layout.mode == "pd":
        pairs = sum(g.count for g in layout.prefill) * sum(g.count for g in layout.decode)
    else:
        pairs = sum(g.count for g in layout.aggregated)
    warmup_s = simulate_run(cfg, [(4, 8)] * pairs, gpu=gpu, max_concurrency=None).duration_s  # serve's pair warm-up
    weights = "dummy weights" if cfg.engine.sglang.load_format == "dummy" else (
        f"weights read at {disk_gb_s:g} GB/s per node" if cfg.engine.sglang.load_format is None
        else f"load format {cfg.engine.sglang.load_format}")
    cluster_s = 0.0 if cfg.simulated else cluster_start_s(cfg)  # a simulated config's local cluster runs the simulation, not its deployment
    return ReadyEstimate(PLACEMENT_S["sglang"] + cluster_s, warm, cold, warmup_s, pairs, jit_cached,
                         f"{gpu} with SGLang, {weights}", cluster_s)


def predict_closed_loop(cfg: RunConfig, concurrencies: Sequence[int] | None = None, gpu: str | None = None,
                        disk_gb_s: float = 2.0, jit_cached: bool = True) -> ClosedLoopPrediction:
    """One simulated window per N (default benchmark.concurrency) on cfg's layout and `gpu` (else cluster.gpu)."""
    gpu = gpu or cfg.cluster.gpu
    ns = sorted(set(concurrencies or cfg.benchmark.concurrency))
    points = [ClosedLoopPoint(n, simulate_closed_loop(cfg, ClosedLoopLoad.of(cfg, n), gpu), cfg.benchmark.slo)
              for n in ns]
    return ClosedLoopPrediction(cfg.layout.describe(), gpu, ClosedLoopLoad.of(cfg, ns[0]), cfg.benchmark.slo, points,
                                predict_ready(cfg, gpu, disk_gb_s, jit_cached))


def calibration_sources(cfg: RunConfig, gpu: str) -> list[str]:
    """Per group, which measured profile times its forwards (or that none does: the roofline cost model), and where its
    graph capture is priced at another layer count than measured (StartupTerms.capture_layers_note)."""
    out = []
    for role, i, group in cfg.layout.groups():
        model = cost_model_for(cfg, role, group, gpu=gpu)
        cal = model.calibration
        if cal is None:
            out.append(f"layout.{role}.{i}: no calibration profile (roofline cost model)")
        elif not cal.shape_matches:
            whose = "the lending model's" if cal.shard_lender else "this shape's own"
            source = (f"{whose} layer counts {', '.join(map(str, cal.floor_counts))} on this GPU's host"
                      if cal.floor_counts else "its shipped profiles of other shapes")
            floor = ("; graphed decode steps on this GPU's measured fixed costs "
                     f"({cal.graph_step_s * 1e3:.2f} ms per step + {cal.graph_layer_s * 1e6:.0f} us per layer, from "
                     f"{source})" if cal.graph_step_s is not None and cal.graph_layer_s is not None
                     and role != "prefill" else "")
            shares = (f"; prefill at the shares of peak of {cal.prefill_lender} (GEMMs {cal.efficiency_prefill:.1%}, attention "
                      f"{cal.efficiency_attention or cal.efficiency_prefill:.1%}: same GPU and weight format, another layer shape)"
                      if cal.prefill_lender and role != "decode" else "")
            out.append(f"layout.{role}.{i}: forwards from the roofline cost model{floor}{shares}; start-up figures from {cal.profile}")
        else:
            out.append(f"layout.{role}.{i}: forwards timed by the measured profile {cal.profile}")
        for note in (cal.shard_note() if cal is not None else None, model.lent_routing_note()):
            if note:
                out[-1] += f"; {note}"
        if cfg.benchmark.closed_loop and model.load_format == "dummy" and role != "prefill":  # the loop's one chain
            out[-1] += (f"; a decode step of this loop's identical greedy requests on dummy weights routes as at most "
                        f"{DUMMY_GREEDY_CYCLE_TOKENS} tokens (perfmodel/weights.decode_routing_tokens)")
        if capture := model.capture_layers_note():
            out.append(f"layout.{role}.{i}: {capture}")
    for names in shared_gpu_groups(cfg):
        out.append(f"{' and '.join(names)} share one GPU (cluster.local.gpu_split: off): their forwards time-slice it, "
                   "each at 1/k of the GPU while k run (perfmodel/scheduling/timeslice.py)")
    return out


def compare_closed_loop(configs: Sequence[tuple[str, RunConfig]], concurrencies: Sequence[int] | None = None
                        ) -> list[tuple[str, ClosedLoopPrediction | str]]:
    """A/B under one SLA: every config predicted with the first config's workload (ISL/OSL, N list, window, grace,
    slo), so PD and aggregated layouts meet the same closed loop; a config that cannot run it gets its reason."""
    from orchestrator.plan.simulation.simulate import SimulationError

    workload = configs[0][1].benchmark
    out: list[tuple[str, ClosedLoopPrediction | str]] = []
    for name, cfg in configs:
        same = cfg.model_copy(update={"benchmark": workload})
        try:
            out.append((name, predict_closed_loop(same, concurrencies)))
        except SimulationError as exc:
            out.append((name, f"does not run: {exc}"))
    return out


def compare_table(results: Sequence[tuple[str, ClosedLoopPrediction | str]]) -> str:
    """Per N, one line per config (good output tok/s, good fraction, TTFT p99, ITL p50, gate); then each config's
    best passing point and its ratio to the first config's."""
    predictions = [(name, p) for name, p in results if not isinstance(p, str)]
    if not predictions:
        return "\n".join(f"{name}: {p}" for name, p in results)
    width = max(len(name) for name, _ in results)
    rows = [f"{'N':>5}  {'config':<{width}}  {'layout':<24} {'out tok/s':>9} {'good tok/s':>10} {'good frac':>9} "
            f"{'TTFT p99 ms':>11} {'ITL p50 ms':>10}  gate ({LABEL})"]
    for n in [p.concurrency for p in predictions[0][1].points]:
        for name, prediction in predictions:
            p = next(x for x in prediction.points if x.concurrency == n)
            rows.append(f"{n:>5}  {name:<{width}}  {prediction.layout[:24]:<24} {p.output_tok_s:>9,.0f} "
                        f"{p.good_output_tok_s:>10,.0f} {p.good_fraction:>9.3f} {p.run.ttft_ms()['p99']:>11,.0f} "
                        f"{p.run.itl_ms()['p50']:>10.1f}  {PASS if p.clears_gate else FAIL}")
    first = results[0][1]
    base = None if isinstance(first, str) else first.best
    for name, outcome in results:
        if isinstance(outcome, str):
            rows.append(f"{name}: {outcome}")
            continue
        best = outcome.best
        if best is None:
            rows.append(f"{name}: no N clears the gate")
            continue
        ratio = f", x{best.good_output_tok_s / base.good_output_tok_s:.2f} the first" if base is not None else ""
        rows.append(f"{name}: best {best.good_output_tok_s:,.0f} good output tok/s at N={best.concurrency}{ratio}")
    return "\n".join(rows)
