"""Virtual-time discrete-event simulation of a whole benchmark run on one layout, timed by the cost model.

batch [(prompt_len, output_len)] -> router (router.policy: Pairing) -> PD: prefill servers (chunked prefill)
  -> KV transfer (serialised per decode link) -> decode servers (continuous batching, KV capacity)
  | aggregated: servers that run either a prefill chunk or a decode step, prefill first (SGLang's default)
-> SimulatedRun (duration, throughput, TTFT / e2e per request). No wall clock is involved: 1000 prompts
take well under a second of CPU.

Modelling choices (why they are safe): the client keeps `max_concurrency` requests in flight, as
`bench` admits them (benchmark.max_in_flight, auto = the decode servers' max running requests). Every
server is one perfmodel/scheduling StepScheduler, the step loop the simulated engine runs too: it decides
each forward (prefill chunk or decode step), its cost-model time, admission, KV and retraction, and a PD
decode's pre-allocation of a request's prompt KV (with SGLang's 512-token headroom per active request)
before its prefill may start, once per turn of its loop as SGLang's DecodePreallocQueue does. This module
adds only the clock: virtual event times, the router's pairing, KV transfers serialised per decode
link. TTFT is when the first token is available to the client (PD: KV landed on decode and the request
joined its running batch; aggregated: end of its last prefill chunk).

Two SGLang/GPU mechanisms on that clock: a PD prefill in SGLang's overlap loop (the default) enqueues a batch's KV
only while processing its result, after it launched the next batch and that batch finished (the result's host copy
waits for it): a finished batch's KV waits for the next forward when one starts at once, measured on one H100
(docs/performance.md, "Where a request's KV transfer time goes"); `--disable-overlap-schedule` sends it at once.
Either way the batch's requests join the transfer queue one by one, KV_ENQUEUE_INTERVAL_S apart (send_batch_kv).
Servers sharing one GPU (a local cluster with gpu_split: off) time-slice it (perfmodel/scheduling/timeslice.py).

What a client sees: every request also waits the answer latency (the servers' GpuSpec.answer_latency_s: HTTP,
SGLang's tokenizer manager and ZMQ hops, the detokenizer, the answer; benchmarks/answer_latency.py), once, charged
between its send and its arrival at the router: TTFT, end-to-end times, the run's duration and, in a closed loop, the
next send all include it; the servers' throughput does not (those processes run beside the scheduler).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from typing import Literal

from orchestrator.config import RunConfig
from orchestrator.perfmodel.scheduling.admission import BatchSchedule
from orchestrator.perfmodel.scheduling.limits import Seq, ServerLimits
from orchestrator.perfmodel.scheduling.request_bounds import never_runs
from orchestrator.perfmodel.scheduling.steps import Forward, Step, StepCostModel, StepScheduler
from orchestrator.perfmodel.scheduling.timeslice import TimeSlicedGpu, shared_gpu_groups
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.server.kv_transfer import KV_ENQUEUE_INTERVAL_S, KV_TRANSFER_QUEUES
from orchestrator.plan.simulation.runs import LABEL, DecodeSteps, SimulatedRun, SimulationError, batch_shapes, synthetic_batch
from orchestrator.plan.simulation.servers import SPANS_NODES, Pairing, SimRequest, SimServer, layout_servers

__all__ = [  # the results and batch helpers live in runs.py; importers may keep using this module
    "LABEL", "SimulatedRun", "SimulationError", "client_concurrency", "batch_shapes",
    "simulate_run", "synthetic_batch", "shared_gpu_groups", "Simulation",
]


ForwardObserver = Callable[[float, str, Forward, BatchSchedule], None]
"""(virtual start time s, server name, the forward, that server's BatchSchedule as the forward starts)"""


class Simulation:
    """The event loop: a heap of (time, seq, action) and the servers the actions touch."""

    def __init__(self, prefill: list[SimServer], decode: list[SimServer], aggregated: list[SimServer],
                 shared_gpus: Sequence[Sequence[str]] = (), answer_s: float | None = None,
                 pairing: Pairing | None = None):
        """`answer_s`: each request's answer latency (None: the servers' GPUs' answer_latency_s; a one-server
        trace passes 0: it times the step loop alone). `pairing`: the router's (None: round robin)."""
        by_name = {s.name: s for s in prefill + decode + aggregated}
        for names in shared_gpus:  # servers that time-slice one GPU (shared_gpu_groups)
            gpu = TimeSlicedGpu(",".join(names))
            for name in names:
                if name in by_name:
                    by_name[name].gpu = gpu
        self.servers = by_name
        self.events: list = []
        self.seq = itertools.count()
        self.now = 0.0
        self.prefill, self.decode, self.aggregated = prefill, decode, aggregated
        self.requests: list[SimRequest] = []
        self.pending: deque[SimRequest] = deque()
        self.in_flight = 0
        self.max_concurrency: int | None = None
        self.pairing = pairing or Pairing()
        self.arrivals: list[SimServer] | None = None  # servers to start once submit_ready has queued everything
        self.bootstrapped: list[SimRequest] = []  # PD: KV pre-allocated this instant; their prefills take them next
        models = [s.model for s in prefill + decode + aggregated if s.model is not None]
        self.answer_s = answer_s if answer_s is not None else max((m.gpu.answer_latency_s for m in models), default=0.0)
        self.arriving: dict[float, list[SimRequest]] = {}  # arrival time -> requests sent answer_s before it
        self.observe: ForwardObserver | None = None  # told of every forward as it starts (a term-by-term reader)
        # the token every request's greedy decode starts from where the workload fixes one (a closed loop's chat
        # turn: plan/closedloop/client.py); None: each request its own, as a ShareGPT batch's prompts are taken
        self.greedy_chain: str | None = None

    def at(self, time_s: float, action, *args) -> None:
        heapq.heappush(self.events, (time_s, next(self.seq), action, args))

    # ---- client ----------------------------------------------------------------------------------
    def submit_ready(self) -> None:
        """Send requests while the client may; servers start once all that arrive at this instant are queued."""
        sent = []
        while self.pending and (self.max_concurrency is None or self.in_flight < self.max_concurrency):
            self.in_flight += 1
            req = self.pending.popleft()
            req.sent_s = self.now
            sent.append(req)
        if sent and self.answer_s > 0:  # every send of this instant arrives in one event
            at = self.now + self.answer_s
            if at not in self.arriving:
                self.arriving[at] = []
                self.at(at, self.arrive_all, at)
            self.arriving[at].extend(sent)
        elif sent:
            self._arrive_together(sent)

    def arrive_all(self, at: float) -> None:
        """The requests sent `answer_s` ago reach the router together."""
        self._arrive_together(self.arriving.pop(at))

    def _arrive_together(self, reqs: list[SimRequest]) -> None:
        """Servers start once all of `reqs` are queued."""
        outer, self.arrivals = self.arrivals, self.arrivals if self.arrivals is not None else []
        for req in reqs:
            self.arrive(req)
        if outer is None:
            arrived, self.arrivals = self.arrivals, None
            for server in dict.fromkeys(arrived):
                self.kick(server)

    def finish(self, req: SimRequest) -> None:
        """The servers are done with `req`: the client may send the next one (the client's seam:
        plan/closedloop/client.py overrides this to resend at once, a closed loop)."""
        req.finish_s = self.now
        self.in_flight -= 1
        if self.pending:
            self.submit_ready()

    # ---- router and servers ----------------------------------------------------------------------
    def arrive(self, req: SimRequest) -> None:
        """`req` reaches the router now: paired onto servers (self.pairing), queued in their step loops."""
        req.arrival_s = self.now
        turn = self.pairing.next_turn()
        req.seq = Seq(req.prompt_len, req.output_len, owner=req, greedy_chain=self.greedy_chain)
        if self.aggregated:
            server = self.pairing.pick("aggregated", self.aggregated, turn)
            self.check_fits(server, req.output_len, req)
            server.steps.submit(req.seq)
            self.kick(server)
            return
        req.decode = self.pairing.pick("decode", self.decode, turn)
        self.check_fits(req.decode, req.output_len, req)
        if self.prefill:  # else a decode-only trace (one_server_trace): the KV is there once allocated
            req.prefill = self.pairing.pick("prefill", self.prefill, turn)
            self.check_fits(req.prefill, 1, req)
            req.prefill_seq = Seq(req.prompt_len, 1, owner=req)  # the prefill samples the first token only
        # SGLang: the prefill waits for the decode's KV, pre-allocated at the decode's next turn
        req.decode.steps.enqueue_prealloc(req.seq, kv_local=req.prefill is None)
        self.kick(req.decode)

    def check_fits(self, server: SimServer, max_new_tokens: int, req: SimRequest) -> None:
        """Refuse, naming the request, one that `server` would never run to its end (it would wait forever)."""
        why = never_runs(server.steps.limits, req.prompt_len, max_new_tokens)
        if why is not None:
            raise SimulationError(
                f"request {req.index} ({req.prompt_len:,} prompt + {req.output_len:,} output tokens) cannot run on "
                f"{server.name}: {why}; lower benchmark.context_len or use a layout with more KV"
            )

    def kick(self, server: SimServer) -> None:
        if self.arrivals is not None:
            self.arrivals.append(server)
        elif not server.busy:
            self.turn(server)

    def turn(self, server: SimServer) -> None:
        """One turn of the server's loop now: its hand-offs, then its next forward on the virtual clock."""
        step = server.steps.schedule()
        server.busy = step.forward is not None  # before the hand-offs, which may kick this server again
        if step.forward is not None:
            self.start_forward(server, step)
        for seq in step.preallocated:  # PD decode: the prefill may start now (a decode-only trace has none)
            if seq.owner.prefill is not None:
                if not self.bootstrapped:
                    self.at(self.now, self.bootstrap)
                self.bootstrapped.append(seq.owner)
        for seq in step.joined:  # PD decode: the KV landed with the prefill's first token
            req = seq.owner
            if req.first_token_s is None:
                req.first_token_s = self.now
            if seq.state == "done":
                self.finish(req)

    def bootstrap(self) -> None:
        """Prefills take the requests whose decode pre-allocated their KV at this instant in arrival order, as
        SGLang's PrefillBootstrapQueue pops bootstrapped requests in its own (arrival) order."""
        ready, self.bootstrapped = sorted(self.bootstrapped, key=lambda r: r.index), []
        for req in ready:
            assert req.prefill is not None and req.prefill_seq is not None
            req.prefill.steps.submit(req.prefill_seq)
        for prefill in dict.fromkeys(req.prefill for req in ready if req.prefill is not None):
            self.kick(prefill)

    def start_forward(self, server: SimServer, step: Step) -> None:
        """The forward ends after its cost-model time, or, on a GPU shared with other servers, when its work has
        drained at 1/k of the GPU while k forwards were in flight there (every start and end re-times the others)."""
        assert step.forward is not None
        if self.observe is not None:
            self.observe(self.now, server.name, step.forward, server.steps.batch)
        if step.forward.kind == "decode" and server.model is not None:
            running = len(step.forward.running)
            server.decode_steps += 1
            server.eager_steps += server.model.decode_runs_eager(running)
            server.peak_running = max(server.peak_running, running)
        if server.gpu is None:
            self.at(self.now + step.forward.duration_s, self.forward_done, server, step)
            return
        server.gpu.start(self.now, server.name, step.forward.duration_s)
        server.step_in_flight = step
        self.retime(server.gpu)

    def retime(self, gpu: TimeSlicedGpu) -> None:
        for name, end_s, token in gpu.completions():
            server = self.servers[name]
            self.at(end_s, self.forward_done, server, server.step_in_flight, token)

    def forward_done(self, server: SimServer, step: Step, token: int | None = None) -> None:
        assert step.forward is not None
        if server.gpu is not None:
            if not server.gpu.finish(self.now, server.name, token if token is not None else -2):
                return  # re-timed since this event was scheduled
            self.retime(server.gpu)
        prefill = step.forward.kind == "prefill"
        computed: list[SimRequest] = []
        for seq in server.steps.update_from_output(step):
            req = seq.owner
            if prefill and server.role == "prefill":
                computed.append(req)
                continue
            if prefill and req.first_token_s is None:  # aggregated: the next token is out
                req.first_token_s = self.now
            if seq.state == "done":
                self.finish(req)
        self.send_batch_kv(server, server.held or ())  # the batch before: its result waited for this forward to end
        server.held = None
        for req in server.unpolled:  # transfers done during this forward: its loop's poll sees them now
            assert req.prefill_seq is not None
            server.steps.release(req.prefill_seq)
        server.unpolled = []
        self.turn(server)
        if server.overlap and server.busy:
            server.held = computed  # sent when the forward just launched ends
        else:
            self.send_batch_kv(server, computed)

    def send_batch_kv(self, prefill: SimServer, reqs: Sequence[SimRequest]) -> None:
        """A batch's KV is enqueued request by request as SGLang's result processing reaches each one
        (process_batch_result_disagg_prefill -> send_kv_chunk), KV_ENQUEUE_INTERVAL_S apart, not at one instant: a
        worker faster than that interval never builds a queue."""
        for i, req in enumerate(reqs):
            self.send_kv(prefill, req, self.now + i * KV_ENQUEUE_INTERVAL_S)

    def send_kv(self, prefill: SimServer, req: SimRequest, enqueued_s: float | None = None) -> None:
        """The request's KV joins the prefill's transfer queue for its decode server at `enqueued_s` (None: now;
        SGLang's queue = sum(decode ports) % 4: one queue per decode server here, up to KV_TRANSFER_QUEUES), whose one
        worker moves one request at a time; its bytes also queue on the decode's receive link, shared with other
        prefills."""
        decode = req.decode
        assert decode is not None and prefill.model is not None, "PD requests are paired with a decode server on submit"
        same_node = prefill.node == decode.node != SPANS_NODES  # one machine: NVLink; else the network (IB)
        queue = self.decode.index(decode) % KV_TRANSFER_QUEUES
        req.kv_enqueued_s = self.now if enqueued_s is None else enqueued_s
        req.kv_started_s = start = max(req.kv_enqueued_s, prefill.kv_workers_free_s.get(queue, 0.0))
        link_start = max(start, decode.link_free_s)
        decode.link_free_s = link_start + prefill.model.kv_transfer_link_s(req.prompt_len, same_node=same_node)
        req.kv_done_s = done = decode.link_free_s + prefill.model.kv_transfer_fixed_s(req.prompt_len)
        prefill.kv_workers_free_s[queue] = done
        self.at(done, self.kv_landed, prefill, decode, req)

    def kv_landed(self, prefill: SimServer, decode: SimServer, req: SimRequest) -> None:
        """The decode takes the request on its next scheduler turn; the prefill frees its KV when its loop next polls
        the transfers (SGLang: once per loop iteration, i.e. when its running forward ends; at once when idle)."""
        assert req.prefill_seq is not None and req.seq is not None
        decode.steps.submit(req.seq)
        self.kick(decode)
        if prefill.polls_transfers and prefill.busy:
            prefill.unpolled.append(req)
            return
        prefill.steps.release(req.prefill_seq)
        self.kick(prefill)  # freed KV may unblock its queue

    def run(self, batch: Sequence[tuple[int, int]], max_concurrency: int | None) -> float:
        self.requests = [SimRequest(i, int(p), int(o)) for i, (p, o) in enumerate(batch)]
        for req in self.requests:
            if req.prompt_len < 1 or req.output_len < 1:
                raise SimulationError(f"request {req.index}: prompt_len and output_len must be >= 1, got {(req.prompt_len, req.output_len)}")
        self.pending = deque(self.requests)
        self.max_concurrency = max_concurrency
        self.submit_ready()
        while self.events:
            self.now, _, action, args = heapq.heappop(self.events)
            action(*args)
        return self.now


def one_server_trace(batch: Sequence[tuple[int, int]], cost: StepCostModel, limits: ServerLimits) -> list[Seq]:
    """The planner's run of `batch` (all at t=0) on one server of `limits`, timed by `cost` (prefill_time_s,
    decode_step_s): each request's Seq, with the forward of its first token and its end. A decode server
    gets each request's KV as soon as it is pre-allocated (no prefill server, no transfer).
    tests/engines/sim/test_sim_matches_plan.py runs the same trace through the simulated engine's scheduler."""
    server = SimServer(f"{limits.role}-0-0", limits.role, SPANS_NODES, None, StepScheduler(limits, cost))
    if limits.role == "prefill":
        raise SimulationError("one_server_trace runs an aggregated or a decode server; a prefill's requests end at its transfer")
    sim = Simulation([], [server], [], answer_s=0.0) if limits.role == "decode" else Simulation([], [], [server], answer_s=0.0)
    sim.run(batch, None)
    seqs = [req.seq for req in sim.requests if req.seq is not None]
    if len(seqs) != len(sim.requests):
        raise SimulationError(f"{len(sim.requests) - len(seqs)} requests never reached the server (simulator bug)")
    return seqs


def client_concurrency(cfg: RunConfig, gpu: str | None = None, sglang_version: str | None = None) -> int:
    """Requests `bench` keeps in flight: benchmark.max_in_flight, or (auto) every decoding server's max running."""
    if cfg.benchmark.max_in_flight != "auto":
        return int(cfg.benchmark.max_in_flight)
    role = "aggregated" if cfg.layout.mode == "aggregated" else "decode"
    return sum(
        cost_model_for(cfg, r, g, gpu=gpu, sglang_version=sglang_version).max_running() * g.count for r, _, g in cfg.layout.groups() if r == role
    )


def simulate_run(
    cfg: RunConfig,
    batch: Sequence[tuple[int, int]],
    gpu: str | None = None,
    max_concurrency: int | None | Literal["auto"] = "auto",
    sglang_version: str | None = None,
    observe: ForwardObserver | None = None,
) -> SimulatedRun:
    """Simulate `batch` [(prompt_len, output_len)] on cfg's layout; GPU = `gpu`, else cfg.cluster.gpu.

    max_concurrency: "auto" = what `bench` admits (client_concurrency), None = everything at t=0.
    observe: called as every forward starts (its time, server, forward and the server's schedule), to read the
    planner's own trace term by term (benchmarks/pd_decode_terms.py); it must not change the schedule.
    """
    if not batch:
        raise SimulationError("the batch is empty; benchmark.num_prompts must be >= 1")
    gpu = gpu or cfg.cluster.gpu
    if isinstance(max_concurrency, str):  # "auto"
        max_concurrency = client_concurrency(cfg, gpu, sglang_version)
    sim = Simulation(*layout_servers(cfg, gpu, sglang_version), shared_gpu_groups(cfg), pairing=Pairing.of(cfg))
    sim.observe = observe
    duration = sim.run(batch, max_concurrency)
    e2e_s = [end - r.sent_s for r in sim.requests if (end := r.finish_s) is not None]
    ttft_s = [first - r.sent_s for r in sim.requests if r.finish_s is not None and (first := r.first_token_s) is not None]
    if len(e2e_s) != len(sim.requests) or len(ttft_s) != len(e2e_s):
        raise SimulationError(f"{len(sim.requests) - len(e2e_s)} requests never finished, "
                              f"{len(e2e_s) - len(ttft_s)} without a first token (simulator bug)")
    return SimulatedRun(
        layout=cfg.layout.describe(),
        gpu=gpu,
        num_requests=len(batch),
        duration_s=duration,
        input_tokens=sum(r.prompt_len for r in sim.requests),
        output_tokens=sum(r.output_len for r in sim.requests),
        ttft_s=ttft_s,
        e2e_s=e2e_s,
        completed=len(e2e_s),
        retracted=sum(server.steps.batch.retracted for server in sim.aggregated + sim.decode),
        decode_steps=[DecodeSteps(s.name, s.decode_steps, s.eager_steps, s.peak_running)
                      for s in sim.aggregated + sim.decode],
    )
