"""Routing policies: which worker of one role gets the next request.

A policy only chooses; the dispatcher owns the per-worker state it chooses from (`WorkerState`:
requests and tokens in flight, health, suspect-until) and keeps it up to date. `router.policy` names a
pairing policy, one choice per role (`POLICIES`):

| name | prefill | decode |
|---|---|---|
| round_robin | in turn | in turn |
| least_outstanding | fewest requests in flight | fewest requests in flight |
| least_tokens | fewest prompt tokens in flight | fewest tokens in flight (prompt + max_new_tokens: the KV it will hold) |
| power_of_two | the less loaded (tokens) of two at random | the same |
| prefix_aware | fewest tokens in flight + prompt tokens not cached there (prefix seen recently) | fewest tokens in flight |
| random | uniformly at random | uniformly at random, drawn apart from the prefill's |

`random` is what the organisers' 2026 deployment ran: sglang-router 0.3.2's default `cache_aware` in PD mode finds no
tree for the model and picks a uniformly random prefill and, apart, a random decode (docs/router.md). Its draws here
are seeded (`router.seed`, one stream per role) so a run can be repeated; power_of_two takes the same seed.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from orchestrator.engines.prefix_blocks import PrefixBlocks
from orchestrator.records import WorkerEndpoint


@dataclass
class WorkerState:
    """What the dispatcher knows about one worker right now."""

    endpoint: WorkerEndpoint
    outstanding: int = 0  # requests sent to it and not yet answered
    outstanding_tokens: int = 0  # their token cost here: prompt tokens (prefill), prompt + max_new_tokens (decode)
    healthy: bool = True  # last health check (or first registration) said it serves
    suspect_until: float = 0.0  # time.monotonic() before which a recent failure keeps it out
    failures: int = 0  # request failures seen (each also makes it suspect for a while)
    health_failures: int = 0  # consecutive failed /health probes

    @property
    def name(self) -> str:
        return self.endpoint.name

    def is_suspect(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) < self.suspect_until


class NoWorkerError(RuntimeError):
    """No worker of a role can take a request (none registered, or none healthy)."""


@dataclass(frozen=True)
class RequestShape:
    """What a policy may know about the request it places (a batched /generate: its first prompt)."""

    prompt_tokens: int = 0
    max_new_tokens: int = 0
    prompt_ids: Sequence[int] = ()


class RoutingPolicy(Protocol):
    def pick(self, candidates: list[WorkerState], request: RequestShape | None = None) -> WorkerState:
        """Choose one of `candidates` (non-empty, all eligible) for `request`."""
        ...


class RoundRobin:
    """Takes eligible workers in turn, in name order, so a changing set still cycles fairly."""

    def __init__(self) -> None:
        self._last: str | None = None

    def pick(self, candidates: list[WorkerState], request: RequestShape | None = None) -> WorkerState:
        ordered = sorted(candidates, key=lambda w: w.name)
        chosen = next((w for w in ordered if self._last is None or w.name > self._last), ordered[0])
        self._last = chosen.name
        return chosen


class LeastOutstanding:
    """Takes the worker with the fewest requests in flight; ties rotate so equal workers share load."""

    def __init__(self) -> None:
        self._tie_break = RoundRobin()

    def pick(self, candidates: list[WorkerState], request: RequestShape | None = None) -> WorkerState:
        fewest = min(w.outstanding for w in candidates)
        return self._tie_break.pick([w for w in candidates if w.outstanding == fewest])


class LeastTokens:
    """Takes the worker with the fewest tokens in flight (work, not request count); ties rotate."""

    def __init__(self) -> None:
        self._tie_break = RoundRobin()

    def pick(self, candidates: list[WorkerState], request: RequestShape | None = None) -> WorkerState:
        fewest = min(w.outstanding_tokens for w in candidates)
        return self._tie_break.pick([w for w in candidates if w.outstanding_tokens == fewest])


class PowerOfTwo:
    """Samples two workers at random and takes the one with fewer tokens in flight (no global scan)."""

    def __init__(self, seed: int | str | None = None) -> None:
        self._rng = random.Random(seed)

    def pick(self, candidates: list[WorkerState], request: RequestShape | None = None) -> WorkerState:
        if len(candidates) == 1:
            return candidates[0]
        a, b = self._rng.sample(candidates, 2)
        return a if a.outstanding_tokens <= b.outstanding_tokens else b


class PrefixAware:
    """Sends a prompt where it costs least to prefill: the worker minimising its tokens in flight plus the
    tokens this prompt would add there, i.e. the prompt less the prefix that worker saw recently (its
    radix cache likely holds it, as SGLang's cache-aware router assumes). A worker that holds a
    conversation's long context so wins its next turns unless it is that much busier; without prompt ids
    it is `LeastTokens`. `new_tokens` tells the dispatcher what the chosen worker will compute.
    """

    def __init__(self, block_tokens: int = 64, capacity_tokens: int = 1 << 20) -> None:
        self.block_tokens = block_tokens
        self.capacity_blocks = max(1, capacity_tokens // block_tokens)
        self._index: dict[str, PrefixBlocks] = {}
        self._least = LeastTokens()
        self._last: tuple[str, int] | None = None  # (worker, new tokens) of the last pick

    def _of(self, w: WorkerState) -> PrefixBlocks:
        index = self._index.get(w.name)
        if index is None:
            index = self._index[w.name] = PrefixBlocks(self.block_tokens, self.capacity_blocks)
        return index

    def pick(self, candidates: list[WorkerState], request: RequestShape | None = None) -> WorkerState:
        if request is None or not request.prompt_ids:
            self._last = None
            return self._least.pick(candidates, request)
        n = len(request.prompt_ids)
        chain = self._of(candidates[0]).chain(request.prompt_ids)
        new = {w.name: n - self._of(w).matched_blocks(chain) * self.block_tokens for w in candidates}
        cheapest = min(w.outstanding_tokens + new[w.name] for w in candidates)
        chosen = self._least.pick([w for w in candidates if w.outstanding_tokens + new[w.name] == cheapest])
        self._of(chosen).insert(chain)
        self._last = (chosen.name, new[chosen.name])
        return chosen

    def new_tokens(self, worker: WorkerState, request: RequestShape) -> int:
        """Prompt tokens `worker` computes for the request just picked (the rest it likely has cached)."""
        if self._last is not None and self._last[0] == worker.name:
            return self._last[1]
        return request.prompt_tokens


class UniformRandom:
    """Takes a worker uniformly at random, blind to load: sglang-router's PD pairing when it has no cache tree."""

    def __init__(self, seed: int | str | None = None) -> None:
        self._rng = random.Random(seed)

    def pick(self, candidates: list[WorkerState], request: RequestShape | None = None) -> WorkerState:
        return candidates[self._rng.randrange(len(candidates))]


SEEDED = (PowerOfTwo, UniformRandom)  # policies that draw: each role gets its own stream of the run's seed

# name -> (prefill policy, decode policy); an aggregated worker uses the prefill one (it caches prefixes)
POLICIES: dict[str, tuple[Callable[[], RoutingPolicy], Callable[[], RoutingPolicy]]] = {
    "round_robin": (RoundRobin, RoundRobin),
    "least_outstanding": (LeastOutstanding, LeastOutstanding),
    "least_tokens": (LeastTokens, LeastTokens),
    "power_of_two": (PowerOfTwo, PowerOfTwo),
    "prefix_aware": (PrefixAware, LeastTokens),
    "random": (UniformRandom, UniformRandom),
}


def role_seed(seed: int | None, role: str) -> str | None:
    """The stream a drawing policy of `role` uses: the prefill's and the decode's draws are independent, and the
    planner's simulated router (plan/simulation/simulate.py) draws from the same streams."""
    return None if seed is None else f"{seed}/{role}"


def make_policy(name: str, role: str = "decode", seed: int | None = None) -> RoutingPolicy:
    """A fresh policy instance for one role (each keeps its own rotation, cache state or random stream)."""
    try:
        prefill, decode = POLICIES[name]
    except KeyError:
        raise ValueError(f"router.policy={name!r} is unknown; allowed: {sorted(POLICIES)}") from None
    factory = decode if role == "decode" else prefill
    return factory(role_seed(seed, role)) if factory in SEEDED else factory()


def eligible(workers: list[WorkerState], role: str, now: float | None = None) -> list[WorkerState]:
    """Healthy, non-suspect workers of `role`; if every healthy one is suspect, all healthy ones.

    Falling back to suspects beats failing the request outright: suspicion is a guess from one
    failure, while "no worker" is certain failure.
    """
    now = time.monotonic() if now is None else now
    healthy = [w for w in workers if w.endpoint.role == role and w.healthy]
    if not healthy:
        known = sum(1 for w in workers if w.endpoint.role == role)
        raise NoWorkerError(
            f"no healthy {role} worker ({known} registered); check the workers' logs and `/health`"
        )
    trusted = [w for w in healthy if not w.is_suspect(now)]
    return trusted or healthy
