"""The closed-loop client of the planner's simulation: N clients, each resending one identical request as its last ends.

ClosedLoopLoad (ISL, OSL, N, window, grace) -> plan/simulation/simulate.py's servers and step loop, with this client on the
arrival side -> ClosedLoopRun: per request its send time, TTFT and ITL, scored as AIPerf scores them.

The client is the whole difference from `simulate_run`: there a fixed batch drains through a concurrency cap;
here every finish sends the next request at that instant, until the window closes. Identical requests sent
together therefore stay together: they prefill one after another (TTFT spreads over the wave), decode as one
batch, finish on the same step and are resent together - lockstep waves, not a steady-state queue. A request
prefilled early in a wave waits for the rest (aggregated: its decode stalls behind their prefill chunks).

AIPerf's phases as modelled: warm-up requests finish before the measured window opens (its phases run one after
the other), so the window starts from idle servers with all N sent at once and the warm-up is not simulated;
requests sent during `window_s` count if they end within `grace_s` after it; throughput is their output tokens
over first send to last end; ITL is AIPerf's inter_token_latency and a request is good when the config's SloConfig
admits it (config/benchmark.py: the gateway's counters judge by the same two).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config import RunConfig
from orchestrator.config.benchmark import SloConfig, good_request_fraction, inter_token_latency_s
from orchestrator.plan.simulation.simulate import ForwardObserver, Simulation, SimulationError, shared_gpu_groups
from orchestrator.plan.simulation.servers import Pairing, SimRequest, layout_servers
from orchestrator.stats import percentile

CHAT_TURN_CHAIN = "chat template: open assistant turn"  # the greedy chain every closed-loop request starts from


@dataclass(frozen=True)
class ClosedLoopLoad:
    """One closed-loop point: N clients, fixed ISL/OSL, the measured window and its grace, in seconds."""

    concurrency: int
    input_tokens: int
    output_tokens: int
    window_s: float
    grace_s: float

    @classmethod
    def of(cls, cfg: RunConfig, concurrency: int) -> "ClosedLoopLoad":
        b = cfg.benchmark
        return cls(concurrency, b.input_tokens, b.output_tokens, b.window_s, b.grace_s)


@dataclass(frozen=True)
class RequestTiming:
    """One request of the window (seconds from the window's start)."""

    sent_s: float
    first_token_s: float
    end_s: float
    output_tokens: int

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.sent_s

    @property
    def itl_s(self) -> float | None:
        return inter_token_latency_s(self.first_token_s, self.end_s, self.output_tokens)


@dataclass
class ClosedLoopRun:
    """The simulated window of one point: every counted request (sent in the window, ended within the grace)."""

    load: ClosedLoopLoad
    requests: list[RequestTiming]
    not_counted: int  # sent in the window but still running when the grace ran out

    @property
    def duration_s(self) -> float:
        return max((r.end_s for r in self.requests), default=0.0)

    @property
    def output_tok_s(self) -> float:
        return sum(r.output_tokens for r in self.requests) / self.duration_s if self.duration_s > 0 else 0.0

    def good(self, slo: SloConfig) -> list[RequestTiming]:
        return [r for r in self.requests if slo.admits(r.ttft_s, r.itl_s)]

    def good_fraction(self, slo: SloConfig) -> float:
        return good_request_fraction(len(self.good(slo)), len(self.requests), errored=0)  # the model fails none

    def good_output_tok_s(self, slo: SloConfig) -> float:
        good = sum(r.output_tokens for r in self.good(slo))
        return good / self.duration_s if self.duration_s > 0 else 0.0

    def ttft_ms(self) -> dict[str, float]:
        return _quantiles([r.ttft_s * 1e3 for r in self.requests])

    def itl_ms(self) -> dict[str, float]:
        return _quantiles([itl_s * 1e3 for r in self.requests if (itl_s := r.itl_s) is not None])

    def waves(self) -> list[list[RequestTiming]]:
        """Requests grouped by send instant (to the microsecond), in send order: the lockstep waves."""
        groups: dict[float, list[RequestTiming]] = {}
        for r in sorted(self.requests, key=lambda r: r.sent_s):
            groups.setdefault(round(r.sent_s, 6), []).append(r)
        return list(groups.values())


def _quantiles(values: list[float]) -> dict[str, float]:
    return {f"p{q}": percentile(values, q) for q in (50, 90, 99)}


class _ClosedLoopSimulation(Simulation):
    """simulate.py's servers and step loop; only the client differs: a finished request is resent at once
    while the window is open."""

    def __init__(self, cfg: RunConfig, load: ClosedLoopLoad, gpu: str, sglang_version: str | None):
        super().__init__(*layout_servers(cfg, gpu, sglang_version), shared_gpu_groups(cfg), pairing=Pairing.of(cfg))
        self.load = load
        # every request is one chat turn through one template: whatever its text, its prompt ends with the template's
        # open assistant turn, the token its greedy decode starts from (perfmodel/weights.decode_routing_tokens)
        self.greedy_chain = CHAT_TURN_CHAIN

    def finish(self, req: SimRequest) -> None:
        super().finish(req)
        if self.now < self.load.window_s:  # this client sends its next request now
            again = SimRequest(len(self.requests), self.load.input_tokens, self.load.output_tokens)
            self.requests.append(again)
            self.pending.append(again)
            self.submit_ready()


def simulate_closed_loop(cfg: RunConfig, load: ClosedLoopLoad, gpu: str | None = None,
                         sglang_version: str | None = None, observe: ForwardObserver | None = None) -> ClosedLoopRun:
    """The measured window of `load` on cfg's layout (GPU `gpu`, else cfg.cluster.gpu), in virtual time. `observe`:
    told of every forward as it starts (simulate.py's ForwardObserver), to read the loop's batches term by term."""
    if load.concurrency < 1 or load.input_tokens < 1 or load.output_tokens < 2:
        raise SimulationError(f"closed loop N={load.concurrency}, ISL {load.input_tokens}, OSL {load.output_tokens}: "
                              "N and ISL must be >= 1 and OSL >= 2")
    context = cfg.model.context_length
    if context is not None and load.input_tokens + load.output_tokens > context:
        raise SimulationError(f"benchmark.input_tokens + output_tokens = {load.input_tokens + load.output_tokens} "
                              f"exceeds model.context_length={context}; raise model.context_length or shorten them")
    sim = _ClosedLoopSimulation(cfg, load, gpu or cfg.cluster.gpu, sglang_version)
    sim.observe = observe
    sim.run([(load.input_tokens, load.output_tokens)] * load.concurrency, load.concurrency)
    end = load.window_s + load.grace_s
    counted, late = [], 0
    for req in sim.requests:
        if req.sent_s >= load.window_s:
            continue
        if req.finish_s is None or req.first_token_s is None:
            raise SimulationError(f"request {req.index} never finished (simulator bug)")
        if req.finish_s > end:
            late += 1
            continue
        counted.append(RequestTiming(req.sent_s, req.first_token_s, req.finish_s, req.output_len))
    return ClosedLoopRun(load, counted, late)
