"""The layout's engine servers and requests on the planner's virtual clock, and the router's pairing onto them.

cfg.layout -> layout_servers -> (prefill, decode, aggregated) SimServers: each one perfmodel/scheduling StepScheduler
with its cost model, node, KV receive link, PD prefill overlap, GPU time-slicing state and decode-step counts.
Pairing picks each request's servers as `router.policy` does (priced_pairing_note and its search and compare
variants: the line `plan`, `plan --search` and `compare` print where it prices another pairing); SimRequest is one
request's path and times through them (sent, arrival at the router, first token, end; its pair and its Seqs).
simulate.py's Simulation drives them.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.config import RunConfig
from orchestrator.config.layout import WorkerGroup
from orchestrator.perfmodel.costmodel import EngineCostModel, cost_model_for
from orchestrator.perfmodel.scheduling.limits import Seq, server_limits
from orchestrator.perfmodel.scheduling.steps import Step, StepScheduler
from orchestrator.perfmodel.scheduling.timeslice import TimeSlicedGpu, shared_gpu_groups
from orchestrator.plan.simulation.runs import SimulationError
from orchestrator.records import Role


@dataclass
class SimRequest:
    index: int
    prompt_len: int
    output_len: int
    arrival_s: float = 0.0  # reached the router (sent_s + the answer latency)
    sent_s: float = 0.0  # the client sent it
    first_token_s: float | None = None
    finish_s: float | None = None
    prefill: SimServer | None = None  # PD: the pair the router chose
    decode: SimServer | None = None
    seq: Seq | None = None  # on the server that decodes it (aggregated, or PD decode)
    prefill_seq: Seq | None = None  # PD: on the prefill server
    kv_enqueued_s: float | None = None  # PD: its KV joined the transfer queue, a worker took it, NIXL had it all
    kv_started_s: float | None = None
    kv_done_s: float | None = None


@dataclass(eq=False)
class SimServer:
    """One engine server: the shared step loop (perfmodel/scheduling) on the virtual clock."""

    name: str
    role: Role
    node: str  # the machine it runs on (server_host): KV between two servers of one machine moves over NVLink
    model: EngineCostModel | None  # its transfers' cost; None in a one-server trace (no transfers)
    steps: StepScheduler
    busy: bool = False  # a forward is running
    link_free_s: float = 0.0  # the decode server's receive link (KV transfers queue on it)
    overlap: bool = False  # PD prefill in SGLang's overlap loop: a batch's KV is sent after the next forward
    held: list[SimRequest] | None = None  # PD prefill: KV computed, waiting for the running forward to end
    kv_workers_free_s: dict[int, float] = field(default_factory=dict)  # PD prefill: transfer queue -> its worker free
    polls_transfers: bool = False  # PD prefill (SGLang): frees a sent request's KV on its loop's next poll
    unpolled: list[SimRequest] = field(default_factory=list)  # transfers done, waiting for that poll
    gpu: TimeSlicedGpu | None = None  # the GPU it time-slices with other servers, if it shares one
    step_in_flight: Step | None = None  # on a shared GPU: the forward whose end the GPU re-times
    decode_steps: int = 0  # decode forwards started, and those past the largest CUDA graph (eager)
    eager_steps: int = 0
    peak_running: int = 0

    @property
    def capacity_tokens(self) -> int:
        return self.steps.limits.kv_capacity_tokens


ONE_HOST = "host"  # every server of a one-machine cluster
SPANS_NODES = "all"  # a server whose group spans machines: no KV link of its own is NVLink


def server_host(cfg: RunConfig, role: Role, group: WorkerGroup) -> str:
    """The machine a server of `group` runs on, as the KV link sees it: the one host of a one-node or
    `cluster.single_host` cluster (a lent multi-GPU host), else its node's role label (servers placed on the same label
    share that node), or SPANS_NODES for a group across nodes."""
    if cfg.cluster.one_machine:
        return ONE_HOST
    return cfg.node_role(role, group) if group.nnodes == 1 else SPANS_NODES


def _servers(cfg: RunConfig, role: Role, gpu: str | None, sglang_version: str | None) -> list[SimServer]:
    out = []
    for _, index, group in [g for g in cfg.layout.groups() if g[0] == role]:
        model = cost_model_for(cfg, role, group, gpu=gpu, sglang_version=sglang_version)
        node = server_host(cfg, role, group)
        capacity = model.kv_capacity_tokens()
        if capacity <= 0:
            raise SimulationError(
                f"{role}-{index}-0: the weights leave no KV cache on {model.gpu.name}; "
                f"run `pd-orchestrator plan` for layouts that fit"
            )
        flags = [*cfg.engine.sglang.extra_args, *group.extra_args]
        overlap_loop = "--disable-overlap-schedule" not in flags and model.pp == 1  # PP's loop never overlaps
        overlap = role == "prefill" and overlap_loop and cfg.engine.kind == "sglang"
        for replica in range(group.count):
            steps = StepScheduler(server_limits(model), model, overlap_launch=overlap_loop)
            out.append(SimServer(f"{role}-{index}-{replica}", role, node, model, steps, overlap=overlap,
                                 polls_transfers=role == "prefill" and cfg.engine.kind == "sglang"))
    return out


def layout_servers(cfg: RunConfig, gpu: str | None, sglang_version: str | None = None
                   ) -> tuple[list[SimServer], list[SimServer], list[SimServer]]:
    """cfg's servers as Simulation takes them: (prefill, decode, aggregated), by the layout's mode."""
    if cfg.layout.mode == "pd":
        return _servers(cfg, "prefill", gpu, sglang_version), _servers(cfg, "decode", gpu, sglang_version), []
    return [], [], _servers(cfg, "aggregated", gpu, sglang_version)


class Pairing:
    """Which server of each role the router gives a request, as `router.policy` says. `random` draws each role apart,
    uniformly, from the stream the router's policy of that role draws from (seed "{router.seed}/{role}",
    router/dispatch/policies.py role_seed); every other policy is priced as round robin, one turn shared by both
    roles (request i -> prefill i mod P, decode i mod D): on the contest's distinct prompts and even load the
    load-aware policies spread requests about as evenly, but their pairs are not modelled."""

    def __init__(self, policy: str = "round_robin", seed: int = 0):
        self.policy = policy
        self._turns = itertools.count()
        self._draws = {role: random.Random(f"{seed}/{role}") for role in ("prefill", "decode", "aggregated")}

    @classmethod
    def of(cls, cfg: RunConfig) -> "Pairing":
        return cls(cfg.router.policy, cfg.router.seed)

    def next_turn(self) -> int:
        return next(self._turns)

    def pick(self, role: str, servers: list["SimServer"], turn: int) -> "SimServer":
        if self.policy == "random":
            return servers[self._draws[role].randrange(len(servers))]
        return servers[turn % len(servers)]


MODELLED_POLICIES = ("round_robin", "random")


def _servers_per_role(cfg: RunConfig) -> Counter:
    return Counter(role for role, _, group in cfg.layout.groups() for _ in range(group.count))


def priced_otherwise(cfg: RunConfig) -> bool:
    """Whether the simulation prices another pairing than router.policy's: a load-aware policy, with a layout that
    leaves the router a choice (more than one server of a role)."""
    return cfg.router.policy not in MODELLED_POLICIES and max(_servers_per_role(cfg).values(), default=0) >= 2


_MODELLED = f"`plan` models {' and '.join(MODELLED_POLICIES)} pairings exactly, not the load-aware ones"


def priced_pairing_note(cfg: RunConfig) -> str | None:
    """One line for `plan` where router.policy is one the simulation does not model (the load-aware ones) and the layout
    leaves the router a choice (more than one server of a role): the pairing it priced instead. None where the priced
    pairing is the policy's own."""
    if not priced_otherwise(cfg):
        return None
    per_role = ", ".join(f"{n} {role}" for role, n in _servers_per_role(cfg).items())
    return (f"router.policy {cfg.router.policy}: priced as round_robin, one turn shared by both roles ({per_role} "
            f"servers); {_MODELLED}")


def priced_pairing_search_note(configs: Sequence[RunConfig]) -> str | None:
    """The same, once for a search's ranked layouts (they share the base config's router.policy): how many are priced
    as round_robin. None where none is."""
    priced = [c for c in configs if priced_otherwise(c)]
    if not priced:
        return None
    policies = "/".join(sorted({c.router.policy for c in priced}))
    return (f"router.policy {policies}: priced as round_robin, one turn shared by both roles, in {len(priced)} of the "
            f"{len(configs)} simulated configs (those with more than one server of a role); {_MODELLED}")


def priced_pairing_compare_note(configs: Sequence[tuple[str, RunConfig]]) -> str | None:
    """The same, once for `compare`'s simulated configs: those priced as round_robin, each with its policy and servers."""
    priced = [(name, c) for name, c in configs if priced_otherwise(c)]
    if not priced:
        return None
    named = ", ".join(f"{name} ({c.router.policy}; "
                      f"{', '.join(f'{n} {role}' for role, n in _servers_per_role(c).items())} servers)"
                      for name, c in priced)
    return f"router.policy priced as round_robin, one turn shared by both roles, for: {named}; {_MODELLED}"


def same_gpu_kv_note(cfg: RunConfig) -> str | None:
    """One line for `plan` where a prefill and a decode server share one GPU (a local cluster with gpu_split: off): their
    KV hand-off is a copy inside that GPU, which the KV worker's constants do not describe. None elsewhere."""
    if cfg.layout.mode != "pd" or not any({n.split("-")[0] for n in names} >= {"prefill", "decode"}
                                          for names in shared_gpu_groups(cfg)):
        return None
    return ("KV hand-off between a prefill and a decode on one GPU: not modelled (a copy inside the GPU; on one H100 its "
            "NIXL worker waited ~13 ms a chunk for the GPU the prefill keeps busy, 2026-11-24 call 1, no fit); priced "
            "as the KV worker between two machines (1.28 ms a chunk + bytes at the IB figure)")
