"""Virtual-time discrete-event simulation of a whole benchmark run on one layout, timed by the cost model.

batch [(prompt_len, output_len)] -> router (round robin) -> PD: prefill servers (chunked prefill)
  -> KV transfer (serialised per decode link) -> decode servers (continuous batching, KV capacity)
  | aggregated: servers that run either a prefill chunk or a decode step, prefill first (SGLang's default)
-> SimulatedRun (duration, throughput, TTFT / e2e per request). No wall clock is involved: 1000 prompts
take well under a second of CPU.

Modelling choices (why they are safe): the client keeps `max_concurrency` requests in flight, as
`bench` admits them (benchmark.max_in_flight, auto = the decode servers' max running requests); a PD
decode server admits a request only when its prompt + max_new_tokens fit in the free KV (full
reservation); an aggregated server admits and retracts like SGLang (perfmodel/admission.py: the running
batch is charged new_token_ratio x its remaining output; a step that does not fit retracts the requests
with the fewest output tokens, which prefill again); TTFT is when the first token is available to the
client (PD: KV landed on decode, after the measured transfer time; aggregated: end of its last prefill chunk).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.config import RunConfig
from orchestrator.perfmodel.admission import NewTokenRatio, admits
from orchestrator.perfmodel.costmodel import EngineCostModel, cost_model_for
from orchestrator.plan.runs import LABEL, SimulatedRun, SimulationError, percentile, sample_batch, synthetic_batch

__all__ = [  # the results and batch helpers live in plan/runs.py; importers may keep using this module
    "LABEL", "SimulatedRun", "SimulationError", "client_concurrency", "percentile", "sample_batch",
    "simulate_run", "synthetic_batch",
]


@dataclass
class _Request:
    index: int
    prompt_len: int
    output_len: int
    arrival_s: float = 0.0
    prefilled: int = 0  # prompt tokens already computed (chunked prefill progress)
    first_token_s: float | None = None
    finish_s: float | None = None
    decode: _Server | None = None  # PD: the decode server the router paired it with
    fill: int = 0  # tokens to prefill: the prompt, or prompt + output so far after a retraction
    generated: int = 0  # output tokens produced before the current stay in the running batch
    join_step: int = 0  # the server's decode step count when it (re)joined the running batch
    retractions: int = 0

    def __post_init__(self) -> None:
        self.fill = self.prompt_len

    @property
    def kv_reserve(self) -> int:
        return self.prompt_len + self.output_len


@dataclass(eq=False)
class _Server:
    """One engine server's queue, KV reservation and running batch (a heap by finishing step)."""

    name: str
    role: str  # prefill | decode | aggregated
    node: str  # role label of its node; 'all' when it spans nodes
    model: EngineCostModel
    capacity_tokens: int
    max_running: int
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)  # heap of (finish_step, seq, request)
    reserved_tokens: int = 0
    context_tokens: int = 0
    step: int = 0
    busy: bool = False
    link_free_s: float = 0.0  # the decode server's receive link (KV transfers queue on it)
    prefill_batch: list = field(default_factory=list)
    ratio: NewTokenRatio = field(default_factory=NewTokenRatio)  # aggregated: SGLang's optimistic admission
    remaining_total: int = 0  # aggregated: output tokens the running batch may still generate
    retracted: int = 0



def _servers(cfg: RunConfig, role: str, gpu: str | None, sglang_version: str | None = None) -> list[_Server]:
    out = []
    for _, index, group in [g for g in cfg.layout.groups() if g[0] == role]:
        model = cost_model_for(cfg, role, group, gpu=gpu, sglang_version=sglang_version)
        # servers on the same role label share a node unless they span nodes (KV moves over NVLink there)
        node = cfg.node_role(role, group) if cfg.cluster.num_nodes > 1 and group.nnodes == 1 else "all"
        for replica in range(group.count):
            out.append(
                _Server(
                    name=f"{role}-{index}-{replica}",
                    role=role,
                    node=node,
                    model=model,
                    capacity_tokens=model.kv_capacity_tokens(),
                    max_running=model.max_running(),
                )
            )
    return out


class _Simulation:
    """The event loop: a heap of (time, seq, action) and the servers the actions touch."""

    def __init__(self, cfg: RunConfig, gpu: str | None, sglang_version: str | None = None):
        self.cfg = cfg
        self.events: list = []
        self.seq = itertools.count()
        self.now = 0.0
        if cfg.layout.mode == "pd":
            self.prefill = _servers(cfg, "prefill", gpu, sglang_version)
            self.decode = _servers(cfg, "decode", gpu, sglang_version)
            self.aggregated: list[_Server] = []
        else:
            self.prefill, self.decode = [], []
            self.aggregated = _servers(cfg, "aggregated", gpu, sglang_version)
        for server in self.prefill + self.decode + self.aggregated:
            if server.capacity_tokens <= 0:
                raise SimulationError(
                    f"{server.name}: the weights leave no KV cache on {server.model.gpu.name}; "
                    f"run `pd-orchestrator plan` for layouts that fit"
                )
        self.requests: list[_Request] = []
        self.pending: deque[_Request] = deque()
        self.in_flight = 0
        self.max_concurrency: int | None = None
        self.rr = itertools.count()

    def at(self, time_s: float, action, *args) -> None:
        heapq.heappush(self.events, (time_s, next(self.seq), action, args))

    # ---- client ----------------------------------------------------------------------------------
    def submit_ready(self) -> None:
        while self.pending and (self.max_concurrency is None or self.in_flight < self.max_concurrency):
            req = self.pending.popleft()
            req.arrival_s = self.now
            self.in_flight += 1
            i = next(self.rr)
            if self.aggregated:
                server = self.aggregated[i % len(self.aggregated)]
            else:
                server = self.prefill[i % len(self.prefill)]
                req.decode = self.decode[i % len(self.decode)]
                self.check_fits(req.decode, req)
            self.check_fits(server, req)
            server.waiting.append(req)
            self.kick(server)

    def check_fits(self, server: _Server, req: _Request) -> None:
        need = req.prompt_len if server.role == "prefill" else req.kv_reserve
        if need > server.capacity_tokens:
            raise SimulationError(
                f"request {req.index} needs {need} KV tokens but {server.name} holds only "
                f"{server.capacity_tokens}; lower benchmark.context_len or use a layout with more KV"
            )

    def finish(self, req: _Request) -> None:
        req.finish_s = self.now
        self.in_flight -= 1
        if self.pending:
            self.submit_ready()

    # ---- servers ---------------------------------------------------------------------------------
    def kick(self, server: _Server) -> None:
        if not server.busy:
            self.start_forward(server)

    def start_forward(self, server: _Server) -> None:
        if server.role == "prefill":
            duration = self.plan_prefill(server)
            done = self.prefill_done
        elif server.role == "decode":
            self.admit_decode(server)
            duration = self.plan_decode(server)
            done = self.decode_done
        else:  # SGLang's default scheduler runs a waiting prefill before the next decode step
            duration = self.plan_prefill(server)
            done = self.prefill_done
            if duration is None:
                duration = self.plan_decode(server)
                done = self.decode_done
        if duration is None:
            server.busy = False
            return
        server.busy = True
        self.at(self.now + duration, done, server)

    def plan_prefill(self, server: _Server) -> float | None:
        """Take up to one chunk of prompt tokens from the queue (the last request may be cut)."""
        budget = server.model.chunked_prefill_tokens
        is_pd_prefill = server.role == "prefill"
        pieces: list[tuple[_Request, int, int]] = []
        while server.waiting and budget > 0:
            req = server.waiting[0]
            if req.prefilled == 0:
                running = len(server.running) + len(pieces)
                if running >= server.max_running:
                    break
                if is_pd_prefill:
                    reserve = req.prompt_len
                    if server.reserved_tokens + reserve > server.capacity_tokens:
                        break
                else:  # SGLang: the running batch is charged new_token_ratio x its remaining output
                    reserve = req.fill
                    if not admits(
                        req.fill, req.output_len - req.generated, server.capacity_tokens,
                        server.context_tokens + server.reserved_tokens, server.remaining_total,
                        server.ratio.current, server.model.page_size,
                    ):
                        break
                server.reserved_tokens += reserve
            take = min(budget, req.fill - req.prefilled)
            pieces.append((req, take, req.prefilled))
            budget -= take
            if req.prefilled + take < req.fill:
                break  # chunked: the rest of this prompt goes in the next forward
            server.waiting.popleft()
        if not pieces:
            return None
        server.prefill_batch = pieces
        return server.model.prefill_time_s([p[1] for p in pieces], [p[2] for p in pieces])

    def prefill_done(self, server: _Server) -> None:
        pieces, server.prefill_batch = server.prefill_batch, []
        for req, take, _ in pieces:
            req.prefilled += take
            if req.prefilled < req.fill:
                continue
            if server.role == "prefill":
                self.send_kv(server, req)
            else:  # aggregated: the next token is out; the request joins the decode batch
                if req.first_token_s is None:
                    req.first_token_s = self.now
                server.reserved_tokens -= req.fill
                self.join_running(server, req)
        self.start_forward(server)

    def send_kv(self, prefill: _Server, req: _Request) -> None:
        decode = req.decode
        assert decode is not None, "PD requests are paired with a decode server on submit"
        same_node = prefill.node == decode.node != "all"
        transfer = prefill.model.kv_transfer_link_s(req.prompt_len, same_node=same_node)
        start = max(self.now, decode.link_free_s)
        decode.link_free_s = start + transfer  # bytes queue on the link; the per-request delay overlaps
        self.at(start + transfer + prefill.model.kv_transfer_delay_s(), self.kv_landed, prefill, decode, req)

    def kv_landed(self, prefill: _Server, decode: _Server, req: _Request) -> None:
        prefill.reserved_tokens -= req.prompt_len
        decode.waiting.append(req)
        self.kick(decode)
        self.kick(prefill)  # freed KV may unblock its queue

    def admit_decode(self, server: _Server) -> None:
        while server.waiting and len(server.running) < server.max_running:
            req = server.waiting[0]
            if server.reserved_tokens + req.kv_reserve > server.capacity_tokens:
                break
            server.waiting.popleft()
            server.reserved_tokens += req.kv_reserve
            req.first_token_s = self.now
            self.join_running(server, req)

    def join_running(self, server: _Server, req: _Request) -> None:
        """The request holds its first (or, after a retraction, its next) token; the rest are decode steps.

        PD decode servers keep the full reservation (prompt + output); aggregated servers track what the
        running batch occupies (prompt + output so far) and what it may still generate."""
        req.generated += 1
        remaining = req.output_len - req.generated
        if server.role == "decode":
            if remaining <= 0:
                server.reserved_tokens -= req.kv_reserve
                self.finish(req)
                return
        elif remaining <= 0:
            self.finish(req)
            return
        server.context_tokens += req.prompt_len + req.generated
        req.join_step = server.step
        server.remaining_total += remaining if server.role != "decode" else 0
        heapq.heappush(server.running, (server.step + remaining, req.index, req))

    def plan_decode(self, server: _Server) -> float | None:
        if not server.running:
            return None
        if server.role == "aggregated":
            self.retract_if_full(server)
        return server.model.decode_step_s(len(server.running), server.context_tokens)

    def retract_if_full(self, server: _Server) -> None:
        """SGLang: a decode step needs one KV slot per running request; when the pool is short, retract the
        requests with the fewest output tokens (then the longest prompts) until it fits, else decay the ratio."""
        def generated(req: _Request) -> int:
            return req.generated + server.step - req.join_step

        need = server.context_tokens + server.reserved_tokens + len(server.running)
        if need <= server.capacity_tokens:
            server.ratio.decay_step()
            return
        order = sorted(server.running, key=lambda e: (generated(e[2]), -e[2].prompt_len))
        keep = set(range(len(server.running)))
        out: list[_Request] = []
        for entry in order:
            if need <= server.capacity_tokens or len(out) == len(server.running) - 1:
                break
            req = entry[2]
            done = generated(req)
            need -= req.prompt_len + done + 1
            server.context_tokens -= req.prompt_len + done
            server.remaining_total -= req.output_len - done
            req.generated, req.fill, req.prefilled = done, req.prompt_len + done, 0
            req.retractions += 1
            out.append(req)
        server.running = [e for e in server.running if e[2] not in out]
        heapq.heapify(server.running)
        server.retracted += len(out)
        for req in reversed(out):
            server.waiting.appendleft(req)
        decoded = sum(generated(e[2]) for e in server.running)
        max_new = sum(e[2].output_len for e in server.running)
        server.ratio.after_retract(decoded, len(server.running), max_new)

    def decode_done(self, server: _Server) -> None:
        server.context_tokens += len(server.running)
        if server.role == "aggregated":
            server.remaining_total -= len(server.running)
        server.step += 1
        while server.running and server.running[0][0] <= server.step:
            _, _, req = heapq.heappop(server.running)
            server.context_tokens -= req.prompt_len + req.output_len
            if server.role == "decode":
                server.reserved_tokens -= req.kv_reserve
            self.finish(req)
        self.start_forward(server)

    def run(self, batch: Sequence[tuple[int, int]], max_concurrency: int | None) -> float:
        self.requests = [_Request(i, int(p), int(o)) for i, (p, o) in enumerate(batch)]
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
    max_concurrency: int | None | str = "auto",
    sglang_version: str | None = None,
) -> SimulatedRun:
    """Simulate `batch` [(prompt_len, output_len)] on cfg's layout; GPU = `gpu`, else cfg.cluster.gpu.

    max_concurrency: "auto" = what `bench` admits (client_concurrency), None = everything at t=0.
    """
    if not batch:
        raise SimulationError("the batch is empty; benchmark.num_prompts must be >= 1")
    gpu = gpu or cfg.cluster.gpu
    if max_concurrency == "auto":
        max_concurrency = client_concurrency(cfg, gpu, sglang_version)
    sim = _Simulation(cfg, gpu, sglang_version)
    duration = sim.run(batch, max_concurrency)
    done = [r for r in sim.requests if r.finish_s is not None]
    if len(done) != len(sim.requests):
        raise SimulationError(f"{len(sim.requests) - len(done)} requests never finished (simulator bug)")
    return SimulatedRun(
        layout=cfg.layout.describe(),
        gpu=gpu,
        num_requests=len(batch),
        duration_s=duration,
        input_tokens=sum(r.prompt_len for r in sim.requests),
        output_tokens=sum(r.output_len for r in sim.requests),
        ttft_s=[r.first_token_s - r.arrival_s for r in done],  # type: ignore[operator]
        e2e_s=[r.finish_s - r.arrival_s for r in done],  # type: ignore[operator]
        completed=len(done),
        retracted=sum(server.retracted for server in sim.aggregated),
    )
