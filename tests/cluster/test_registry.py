"""The worker registry follows which replicas are alive, not which ones remembered to say goodbye.

A replica killed without unregistering (Serve force-kills one whose graceful shutdown overruns; a node dies)
leaves the router's view; a successor with the same name keeps its entry when its predecessor's late
unregister arrives; a name is never handed to two live replicas (Serve reuses and compacts ranks, so the
rank alone can collide). The rules run on the plain class with a set of live owners; one Ray test checks
the liveness lookup itself on real actors in Serve's namespace.
"""

from __future__ import annotations

import uuid

import pytest

from orchestrator.cluster import registry as registry_module
from orchestrator.cluster.registry import REPLICA_NAMESPACE, Registry, actor_alive
from orchestrator.records import WorkerEndpoint


class Owners(set):
    def alive(self, name: str) -> bool:
        return name in self


def endpoint(name: str, port: int) -> WorkerEndpoint:
    return WorkerEndpoint(role="prefill", name=name, url=f"http://127.0.0.1:{port}")


@pytest.fixture
def owners() -> Owners:
    return Owners({"replica-a", "replica-b", "replica-c"})


@pytest.fixture
def reg(owners: Owners, monkeypatch) -> Registry:
    monkeypatch.setattr(registry_module, "LIVENESS_EVERY_S", 0.0)  # look owners up on every snapshot
    return Registry(alive=owners.alive)


def names(reg: Registry) -> set[str]:
    return {e.name for e in reg.snapshot()[1]}


def test_a_replica_killed_without_unregistering_leaves_the_view(reg: Registry, owners: Owners) -> None:
    reg.register(endpoint("prefill-0/0", 31000), "replica-a")
    reg.register(endpoint("prefill-0/1", 31001), "replica-b")
    reg.register(endpoint("manual/0", 31002))  # no owner (registered by hand, as the metrics test does): kept
    version = reg.snapshot()[0]
    assert names(reg) == {"prefill-0/0", "prefill-0/1", "manual/0"}

    owners.discard("replica-a")  # force-killed: no __del__, no unregister
    assert names(reg) == {"prefill-0/1", "manual/0"}
    assert reg.snapshot()[0] > version, "the router and the scrape targets follow version changes only"


def test_a_late_unregister_does_not_remove_the_successors_entry(reg: Registry) -> None:
    reg.register(endpoint("prefill-0/0", 31000), "replica-a")
    reg.register(endpoint("prefill-0/0", 31002), "replica-b")  # the successor took the name
    reg.unregister("prefill-0/0", "replica-a")  # the predecessor's __del__, arriving late
    assert [e.url for e in reg.snapshot()[1]] == ["http://127.0.0.1:31002"]
    reg.unregister("prefill-0/0", "replica-b")
    assert names(reg) == set()


def test_a_name_is_never_held_by_two_live_replicas(reg: Registry, owners: Owners) -> None:
    assert reg.claim_name("decode-0", 0, "replica-a") == "decode-0/0"
    assert reg.claim_name("decode-0", 0, "replica-a") == "decode-0/0"  # a retry keeps it
    # Serve handed rank 0 to a second live replica (ranks compacted while the first one was still up)
    assert reg.claim_name("decode-0", 0, "replica-b") == "decode-0/1"
    assert reg.claim_name("decode-0", 2, "replica-c") == "decode-0/2"
    owners.discard("replica-a")
    owners.add("replica-d")
    assert reg.claim_name("decode-0", 1, "replica-d") == "decode-0/0"  # 1 is held; 0 is free once its holder died


def test_pruning_a_dead_entry_keeps_the_successors_claim(reg: Registry, owners: Owners) -> None:
    assert reg.claim_name("prefill-0", 0, "replica-a") == "prefill-0/0"
    reg.register(endpoint("prefill-0/0", 31000), "replica-a")
    owners.discard("replica-a")  # killed without unregistering; its successor claims the name before any snapshot
    assert reg.claim_name("prefill-0", 0, "replica-b") == "prefill-0/0"
    assert names(reg) == set()  # the dead entry is pruned ...
    assert reg.claim_name("prefill-0", 0, "replica-c") == "prefill-0/1"  # ... but the live successor keeps the name


@pytest.mark.ray
def test_liveness_is_the_replica_actor_itself(ray_driver) -> None:
    """actor_alive on real actors: named in Serve's namespace, alive until killed, then gone at once."""
    import ray

    @ray.remote(num_cpus=0)
    class FakeReplica:
        def ping(self) -> bool:
            return True

    name = f"pdo-test-replica-{uuid.uuid4().hex[:8]}"
    actor = FakeReplica.options(name=name, namespace=REPLICA_NAMESPACE).remote()
    ray.get(actor.ping.remote())
    assert actor_alive(name)
    ray.kill(actor)
    from tests.support import wait_until

    wait_until(lambda: not actor_alive(name), 30, what=f"the killed actor {name} to be gone from the GCS")
    assert not actor_alive(f"pdo-test-never-existed-{uuid.uuid4().hex[:8]}")


def test_a_held_worker_is_listed_but_not_routed_until_admitted_and_a_refresh_keeps_it_admitted(reg: Registry):
    reg.register(endpoint("prefill-0/0", 1000), "replica-a")
    v0, _ = reg.snapshot()
    reg.register(endpoint("prefill-0/1", 1001), "replica-b", held=True)
    version, routed = reg.snapshot()
    assert [e.name for e in routed] == ["prefill-0/0"]
    assert dict((e.name, s) for e, s in reg.entries()) == {"prefill-0/0": "routed", "prefill-0/1": "held"}
    assert reg.admit("prefill-0/1") > version  # the router follows a version change only
    reg.register(endpoint("prefill-0/1", 1001), "replica-b", held=True)  # Serve's periodic re-registration
    assert sorted(e.name for e in reg.snapshot()[1]) == ["prefill-0/0", "prefill-0/1"]


def test_a_retired_worker_leaves_routing_at_once_and_stays_listed_until_it_unregisters(reg: Registry):
    reg.register(endpoint("prefill-0/0", 1000), "replica-a")
    reg.register(endpoint("prefill-0/1", 1001), "replica-b")
    version, _ = reg.snapshot()
    assert reg.retire("prefill-0/1") > version
    reg.register(endpoint("prefill-0/1", 1001), "replica-b")  # its health-check refresh does not bring it back
    assert [e.name for e in reg.snapshot()[1]] == ["prefill-0/0"]
    assert dict((e.name, s) for e, s in reg.entries())["prefill-0/1"] == "retired"
    reg.unregister("prefill-0/1", "replica-b")
    assert [(e.name, state) for e, state in reg.entries()] == [("prefill-0/0", "routed")]


def states(reg: Registry) -> dict[str, str]:
    return {e.name: s for e, s in reg.entries()}


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("predecessor", ["unregistered", "killed", "entry still there"])
def test_a_replica_serve_put_in_a_dead_ones_slot_is_held_until_admitted(reg: Registry, owners: Owners, held: bool,
                                                                      predecessor: str):
    """`serve`: a replica's application is its slot. The first owner of a slot routes as it was started (an initial
    replica at once, one `serve apply` added once admitted); a replacement in the same slot is held until `serve` has
    warmed its pairs, whatever became of its predecessor's entry and under whatever name it registers."""
    owners.add("replica-d")
    reg.register(endpoint("decode-1/0", 1000), "replica-a", held=held, slot="workers-decode-1-0")
    reg.admit("decode-1/0")
    assert states(reg) == {"decode-1/0": "routed"}
    if predecessor == "unregistered":  # Serve's graceful stop ran its __del__
        reg.unregister("decode-1/0", "replica-a")
    elif predecessor == "killed":  # force-killed: its entry is dropped once its actor is gone
        owners.discard("replica-a")
        reg.snapshot()
    else:  # its actor still drains while the replacement registers under the same name
        pass
    reg.register(endpoint("decode-1/0", 1005), "replica-d", held=held, slot="workers-decode-1-0")
    assert states(reg) == {"decode-1/0": "held"} and names(reg) == set()
    reg.register(endpoint("decode-1/0", 1005), "replica-d", held=held, slot="workers-decode-1-0")  # a refresh
    assert names(reg) == set()
    reg.admit("decode-1/0")
    reg.register(endpoint("decode-1/0", 1005), "replica-d", held=held, slot="workers-decode-1-0")
    assert names(reg) == {"decode-1/0"}


def test_a_replacement_under_another_name_is_held_and_bench_replicas_without_a_slot_never_are(reg: Registry):
    reg.register(endpoint("decode-0/0", 1000), "replica-a", slot="workers-decode-0-0")
    reg.register(endpoint("decode-0/2", 1001), "replica-b", slot="workers-decode-0-0")  # the old one still held /0
    assert states(reg) == {"decode-0/0": "routed", "decode-0/2": "held"}
    reg.register(endpoint("prefill-0/0", 1002), "replica-c")  # `bench`: no slot, Serve's replacements route at once
    reg.register(endpoint("prefill-0/0", 1003), "replica-d")
    assert states(reg)["prefill-0/0"] == "routed"


def test_a_start_failure_is_kept_until_that_worker_registers_or_the_registry_is_cleared(reg: Registry) -> None:
    reg.report_start_failure("decode-0/0", "decode-0/0: engine not ready after 3 s")
    reg.report_start_failure("prefill-0/0", "prefill-0/0: engine not ready after 3 s")
    assert reg.start_failures() == {"decode-0/0": "decode-0/0: engine not ready after 3 s",
                                    "prefill-0/0": "prefill-0/0: engine not ready after 3 s"}
    reg.register(endpoint("prefill-0/0", 31000), "replica-a")  # a later replica of that name started its engine
    assert reg.start_failures() == {"decode-0/0": "decode-0/0: engine not ready after 3 s"}
    reg.clear()  # a new run on this cluster: an earlier run's failures are not its own
    assert reg.start_failures() == {}
