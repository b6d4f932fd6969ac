"""Worker registry: a named Ray actor where every engine-worker replica announces its endpoint.

Serve handles route to *some* replica; a PD router must know *each* server's URL and bootstrap port.
Worker replicas register on start (and again on every Serve health check), unregister on shutdown;
the router reads `snapshot()` and so follows Serve's view of which replicas are alive.

Routing admission (`serve`): a replica started `held` registers out of routing: `snapshot()` leaves it
out until `admit(name)` (after its pairs are warmed); `retire(name)` takes a routed worker out of `snapshot()`
again before it is drained and removed. `entries()` lists every worker with its state, held ones too. A replica
that names its `slot` (`serve`: its one-replica application) and is not the first owner of that slot is a
replacement Serve started for a dead one: it registers held too, whatever it was started as, and `serve` warms its
pairs before admitting it (a cold PD pair's first request can stall for tens of seconds).

A replica cannot be trusted to unregister itself: Serve force-kills one whose graceful shutdown overruns
(20 s; a loaded node gets there), a node can die with its replicas. So every entry names its owner (the
replica's Ray actor name) and `snapshot()` drops entries whose owner actor is gone. Names are claimed
here too: Serve reuses and compacts replica ranks, so `{deployment}/{rank}` alone can name two live
replicas at once (a replacement placed while its predecessor drains, then ranks compacted) and one's
unregister would remove the other's entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import ray

from orchestrator.records import WorkerEndpoint

REGISTRY_NAME = "pd_worker_registry"
NAMESPACE = "pd-orchestrator"
REPLICA_NAMESPACE = "serve"  # Serve names every replica actor in this namespace
LIVENESS_EVERY_S = 2.0  # owner actors are looked up in the GCS at most this often


def actor_alive(name: str, namespace: str = REPLICA_NAMESPACE) -> bool:
    """Whether the named actor still exists (the GCS frees a dead actor's name)."""
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    except Exception:  # the GCS did not answer: cannot tell, so keep the entry
        return True
    return True


class WorkersFailedToStart(RuntimeError):
    """A worker's replica gave up on its engine's start-up; the message is each such worker's one line."""


class Registry:
    """The registry's state and rules; `WorkerRegistry` is this class as a Ray actor. `alive` says whether an
    owner (a replica's actor name) still exists."""

    def __init__(self, alive: Callable[[str], bool] = actor_alive) -> None:
        self._alive = alive
        self._workers: dict[str, WorkerEndpoint] = {}
        self._owners: dict[str, str] = {}  # worker name -> owning replica actor (none: registered by hand)
        self._claims: dict[str, str] = {}  # worker name -> the replica actor that claimed it
        self._held: set[str] = set()  # registered but not routed: warming (started held) or retired (draining)
        self._slots: dict[str, str] = {}  # slot -> the replica actor that last registered from it
        self._retired: set[str] = set()
        self._start_failures: dict[str, str] = {}  # worker name -> the one line its replica gave up starting with
        # versions start from the clock: a registry re-created after the old one died never repeats a version
        # its followers already saw (they update on a version change only)
        self._version = time.time_ns() // 1_000_000
        self._checked_at = 0.0

    def claim_name(self, deployment: str, preferred: int, owner: str) -> str:
        """`{deployment}/{preferred}` unless another live replica holds it; then the lowest free index."""
        candidates = [preferred, *(i for i in range(preferred + len(self._claims) + 2) if i != preferred)]
        for index in candidates:  # the last one is always free
            name = f"{deployment}/{index}"
            holder = self._claims.get(name)
            if holder in (None, owner) or not self._alive(holder):
                self._claims[name] = owner
                return name
        raise AssertionError("unreachable: more candidate names than claims")

    def register(self, endpoint: WorkerEndpoint, owner: str | None = None, held: bool = False,
                 slot: str | None = None) -> int:
        """Add or refresh `endpoint`; `held`, or a new owner of a `slot` another owner registered from before (a
        replacement): a new entry stays out of routing until `admit`. A refresh (same name, same owner) keeps the
        entry's state, so the periodic re-registration does not undo an admission."""
        name = endpoint.name
        self._start_failures.pop(name, None)
        new_entry = name not in self._workers or self._owners.get(name) != owner
        replacement = slot is not None and self._slots.get(slot) not in (None, owner)
        if slot is not None and owner is not None:
            self._slots[slot] = owner
        if new_entry and (held or replacement):
            self._held.add(name)
            self._retired.discard(name)
        changed = self._workers.get(endpoint.name) != endpoint or self._owners.get(endpoint.name) != owner
        self._workers[endpoint.name] = endpoint
        if owner is None:
            self._owners.pop(endpoint.name, None)
        else:
            self._owners[endpoint.name] = owner
        if changed:
            self._version += 1
        return self._version

    def unregister(self, name: str, owner: str | None = None) -> int:
        """Remove `name`; with `owner`, only while that replica still owns it (not its successor's entry)."""
        if owner is not None and self._owners.get(name) not in (None, owner):
            return self._version
        if self._workers.pop(name, None) is not None:
            self._version += 1
        self._owners.pop(name, None)
        self._held.discard(name)
        self._retired.discard(name)
        if owner is not None and self._claims.get(name) == owner:
            del self._claims[name]
        return self._version

    def snapshot(self) -> tuple[int, list[WorkerEndpoint]]:
        """(version, endpoints) of live, routed replicas; the version changes whenever that set or an endpoint
        changes."""
        if time.monotonic() - self._checked_at >= LIVENESS_EVERY_S:
            self._checked_at = time.monotonic()
            self.drop_dead_owners()
        return self._version, [e for name, e in self._workers.items() if name not in self._held]

    def entries(self) -> list[tuple[WorkerEndpoint, str]]:
        """Every registered worker with its state: routed, held (not yet admitted) or retired (draining)."""
        return [(e, "retired" if name in self._retired else "held" if name in self._held else "routed")
                for name, e in self._workers.items()]

    def admit(self, name: str) -> int:
        """Route to `name` from now on (its pairs are warm)."""
        if name in self._held:
            self._held.discard(name)
            self._retired.discard(name)
            self._version += 1
        return self._version

    def retire(self, name: str) -> int:
        """Stop routing to `name` (it is about to be drained and removed); it stays listed in `entries()`."""
        if name in self._workers and name not in self._retired:
            self._held.add(name)
            self._retired.add(name)
            self._version += 1
        return self._version

    def drop_dead_owners(self) -> list[str]:
        """Remove the entries whose replica actor is gone; returns their names."""
        dead = {name: owner for name, owner in self._owners.items() if not self._alive(owner)}
        for name, owner in dead.items():
            self._workers.pop(name, None)
            self._held.discard(name)
            self._retired.discard(name)
            del self._owners[name]
            if self._claims.get(name) == owner:  # a successor may have claimed the name already: keep its claim
                del self._claims[name]
        if dead:
            self._version += 1
        return list(dead)

    def report_start_failure(self, name: str, line: str) -> None:
        """`name`'s replica gave up on its engine's start-up (its ready timeout ran out): `line` says why, for the
        driver waiting on the workers; a later registration of that name clears it."""
        self._start_failures[name] = line

    def start_failures(self) -> dict[str, str]:
        return dict(self._start_failures)

    def clear(self) -> None:
        self._start_failures.clear()
        self._workers.clear()
        self._held.clear()
        self._retired.clear()
        self._owners.clear()
        self._claims.clear()
        self._slots.clear()
        self._version += 1


WorkerRegistry = ray.remote(num_cpus=0)(Registry)


def get_registry() -> "ray.actor.ActorHandle":
    """The cluster's registry actor, created on first use (detached so replicas outlive drivers)."""
    return WorkerRegistry.options(
        name=REGISTRY_NAME, namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()
