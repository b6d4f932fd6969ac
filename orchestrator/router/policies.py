"""Routing policies: which worker of one role gets the next request (round robin, least outstanding).

A policy only chooses; the dispatcher owns the per-worker state it chooses from (`WorkerState`:
outstanding count, health, suspect-until) and keeps it up to date. Policies are registered by the name
used in `router.policy` of the run config.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

from orchestrator.records import WorkerEndpoint


@dataclass
class WorkerState:
    """What the dispatcher knows about one worker right now."""

    endpoint: WorkerEndpoint
    outstanding: int = 0  # requests sent to it and not yet answered
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


class RoutingPolicy(Protocol):
    def pick(self, candidates: list[WorkerState]) -> WorkerState:
        """Choose one of `candidates` (non-empty, all eligible)."""
        ...


class RoundRobin:
    """Takes eligible workers in turn, in name order, so a changing set still cycles fairly."""

    def __init__(self) -> None:
        self._last: str | None = None

    def pick(self, candidates: list[WorkerState]) -> WorkerState:
        ordered = sorted(candidates, key=lambda w: w.name)
        chosen = next((w for w in ordered if self._last is None or w.name > self._last), ordered[0])
        self._last = chosen.name
        return chosen


class LeastOutstanding:
    """Takes the worker with the fewest requests in flight; ties rotate so equal workers share load."""

    def __init__(self) -> None:
        self._tie_break = RoundRobin()

    def pick(self, candidates: list[WorkerState]) -> WorkerState:
        fewest = min(w.outstanding for w in candidates)
        return self._tie_break.pick([w for w in candidates if w.outstanding == fewest])


POLICIES: dict[str, Callable[[], RoutingPolicy]] = {
    "round_robin": RoundRobin,
    "least_outstanding": LeastOutstanding,
}


def make_policy(name: str) -> RoutingPolicy:
    """A fresh policy instance (one per role: they keep their own rotation state)."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"router.policy={name!r} is unknown; allowed: {sorted(POLICIES)}") from None


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
