"""A simulated run against its model: did this host keep the simulated engine on the cost model's time?

bench (simulated engine) -> the cost model's run of the exact batch (plan.simulation.simulate: same prompts, order and
admission limit) -> after the measured run: SimFidelity(modelled vs measured run, each engine's pacing)
-> result.json "simulation", one line after SGLang's block.

The simulated engine sleeps the model's step times; a host too slow or too busy to keep up makes the run
longer than the model, and then the block's throughput is this host's, not the simulated GPUs'. Within
TOLERANCE the run reports the model's throughput; beyond it the line says by how much the host fell
behind and gives the modelled throughput next to the measured one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from orchestrator.config import RunConfig
from orchestrator.plan.simulation.simulate import SimulatedRun, simulate_run

TOLERANCE = 0.05  # |measured / modelled - 1| within which the measured run reports the model's throughput


@dataclass
class SimFidelity:
    """The measured run of a simulated engine next to the cost model's run of the same batch."""

    modelled_run_s: float
    measured_run_s: float
    modelled_output_throughput: float
    modelled_total_throughput: float
    measured_output_throughput: float
    measured_total_throughput: float
    gpu: str
    engines: dict[str, dict] = field(default_factory=dict)  # worker -> /server_info sim.pacing (+ kv_payload)
    tolerance: float = TOLERANCE

    @property
    def slowdown(self) -> float:
        """measured / modelled - 1: +0.5 = the run took 50 % longer than the model (host too slow)."""
        return self.measured_run_s / self.modelled_run_s - 1 if self.modelled_run_s > 0 else 0.0

    @property
    def within_tolerance(self) -> bool:
        return abs(self.slowdown) <= self.tolerance

    @property
    def behind_model(self) -> bool:
        return self.slowdown > self.tolerance

    @property
    def host_lost_s(self) -> float:
        """Seconds the engines' schedulers fell behind the model's timeline beyond their catch-up (CPU-starved)."""
        return sum(e.get("pacing", {}).get("host_lost_s", 0.0) for e in self.engines.values())

    def line(self) -> str:
        run = (f"measured run {self.measured_run_s:.1f} s vs the cost model's {self.modelled_run_s:.1f} s "
               f"({self.slowdown:+.1%})")
        if self.within_tolerance:
            return (f"SIMULATED {self.gpu}: {run}, within ±{self.tolerance:.0%} of the cost model: the throughput "
                    "above is the model's for the simulated GPUs")
        if self.behind_model:
            return (f"SIMULATED {self.gpu}: {run}, {self.measured_run_s / self.modelled_run_s:.2f}x, behind the cost "
                    f"model by more than ±{self.tolerance:.0%}: the throughput above is this run on this host, not the "
                    f"modelled {self.gpu} GPUs' "
                    f"({self.modelled_output_throughput:,.0f} output tok/s, {self.modelled_total_throughput:,.0f} "
                    f"total tok/s); engine steps lost to a busy host: {self.host_lost_s:.1f} s")
        return f"SIMULATED {self.gpu}: {run}, faster than the cost model's run (check the simulator's pacing)"

    def to_dict(self) -> dict:
        return {**asdict(self), "slowdown": self.slowdown, "within_tolerance": self.within_tolerance,
                "behind_model": self.behind_model, "host_lost_s": self.host_lost_s}


def modelled_run(cfg: RunConfig, batch: Sequence[tuple[int, int]], max_in_flight: int) -> SimulatedRun | None:
    """The cost model's run of the batch bench sends (its order, its admission limit); None for real engines."""
    if not cfg.simulated or not batch:
        return None
    return simulate_run(cfg, batch, gpu=cfg.sim_profile, max_concurrency=max_in_flight)


def engine_pacing(endpoints: list) -> dict[str, dict]:
    """Each simulated engine's own account (/server_info sim.pacing and sim.kv_payload); {} where absent."""
    import httpx

    out: dict[str, dict] = {}
    for ep in endpoints:
        try:
            sim = httpx.get(ep.url + "/server_info", timeout=10.0).json().get("sim") or {}
        except (httpx.HTTPError, ValueError):
            continue
        out[ep.name] = {k: sim[k] for k in ("pacing", "kv_payload") if k in sim}
    return out


def fidelity(model: SimulatedRun | None, measured_run_s: float, output_tokens: int, total_tokens: int,
             engines: dict[str, dict]) -> SimFidelity | None:
    """None when there is nothing to compare (real engines, or no measured run)."""
    if model is None or measured_run_s <= 0:
        return None
    return SimFidelity(
        modelled_run_s=model.duration_s,
        measured_run_s=measured_run_s,
        modelled_output_throughput=model.output_throughput,
        modelled_total_throughput=model.total_throughput,
        measured_output_throughput=output_tokens / measured_run_s,
        measured_total_throughput=total_tokens / measured_run_s,
        gpu=model.gpu,
        engines=engines,
    )
