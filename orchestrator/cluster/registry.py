"""Worker registry: a named Ray actor where every engine-worker replica announces its endpoint.

Serve handles route to *some* replica; a PD router must know *each* server's URL and bootstrap port.
Worker replicas register on start (and again on every Serve health check), unregister on shutdown;
the router reads `snapshot()` and so follows Serve's view of which replicas are alive.
"""

from __future__ import annotations


import ray

from orchestrator.records import WorkerEndpoint

REGISTRY_NAME = "pd_worker_registry"
NAMESPACE = "pd-orchestrator"


@ray.remote(num_cpus=0)
class WorkerRegistry:
    def __init__(self) -> None:
        self._workers: dict[str, WorkerEndpoint] = {}
        self._version = 0

    def register(self, endpoint: WorkerEndpoint) -> int:
        changed = self._workers.get(endpoint.name) != endpoint
        self._workers[endpoint.name] = endpoint
        if changed:
            self._version += 1
        return self._version

    def unregister(self, name: str) -> int:
        if self._workers.pop(name, None) is not None:
            self._version += 1
        return self._version

    def snapshot(self) -> tuple[int, list[WorkerEndpoint]]:
        """(version, endpoints); the version changes whenever the set or an endpoint changes."""
        return self._version, list(self._workers.values())

    def clear(self) -> None:
        self._workers.clear()
        self._version += 1


def get_registry() -> "ray.actor.ActorHandle":
    """The cluster's registry actor, created on first use (detached so replicas outlive drivers)."""
    return WorkerRegistry.options(
        name=REGISTRY_NAME, namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()
