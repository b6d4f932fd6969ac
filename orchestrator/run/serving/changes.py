"""`serve apply`: a live layout change (P:D ratio, a new group) on the running service, nothing in flight lost.

check (one line refusals, the service unchanged): the new config validates, only layout groups change (count, new
or removed groups), the cluster can host the new layout -> remove (retire from routing, wait until the router and
the engine hold none of its requests, delete its application) -> add (place held, load, one real request through
each new pair) -> admit (the router routes to it from the next registry version). A removal that would leave its
role with no routed worker waits until the additions are in.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import yaml

from orchestrator.config import RunConfig
from orchestrator.config.load import ConfigError, OverridePathError, apply_override, config_from_dict, parse_override
from orchestrator.records import WorkerEndpoint
from orchestrator.run.serving.warmup import engine_counts, pairs_touching, warm_pairs

if TYPE_CHECKING:
    from deployments.app import ReplicaApp
    from orchestrator.run.serving.service import Service

ROUTER_FOLLOW_S = 30.0  # the router polls the registry every second; a slower answer is a fault
READMIT_EVERY_S = 2.0  # how often a serving service looks for replicas Serve put in place of dead ones
READMIT_RETRY_S = 10.0  # after a failed pair warm-up of such a replica


class ChangeRefused(ValueError):
    """The change cannot be made as asked; one line naming the field and the fix. The service is unchanged."""


@dataclass
class LayoutChange:
    current: RunConfig
    new: RunConfig
    added: list["ReplicaApp"] = field(default_factory=list)
    removed: list["ReplicaApp"] = field(default_factory=list)


def new_config(current: RunConfig, config_yaml: str | None, overrides: list[str]) -> RunConfig:
    """The layout asked for: the given file (else the running config) with the --set overrides; one-line errors."""
    try:
        data = yaml.safe_load(config_yaml) if config_yaml is not None else current.model_dump(mode="json")
    except yaml.YAMLError as exc:
        raise ChangeRefused(f"--config is not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise ChangeRefused("--config: the top level must be a mapping of sections")
    # a running gateway keeps its port (serve may have moved a busy one) whatever the file says; set before the
    # overrides, so a --set router.port is a change of the router, refused by plan_change, not dropped
    if not isinstance(data.get("router"), dict):
        data["router"] = {}
    data["router"]["port"] = current.router.port
    try:
        for text in overrides:
            keys, value = parse_override(text)
            try:
                apply_override(data, keys, value)
            except OverridePathError as exc:
                raise ConfigError("--set", [f"{text!r}: {exc}"]) from None
        new = config_from_dict(data, "apply")
    except ConfigError as exc:
        raise ChangeRefused("; ".join(f"{exc.source}: {p}" for p in exc.problems)) from None
    return new.model_copy(update={"name": current.name})  # the service's name stays (its state file, socket)


def plan_change(current: RunConfig, new: RunConfig) -> LayoutChange:
    """The replicas to add and remove, or ChangeRefused when more than layout groups would change."""
    from deployments.app import group_deployment_name, replica_apps

    for name in RunConfig.model_fields:
        if name not in ("layout", "name") and getattr(new, name) != getattr(current, name):
            raise ChangeRefused(f"{name}: differs from the running service's; a live change takes layout groups only "
                                "(a group's count, new or removed groups): stop the service and serve again")
    if new.layout.mode != current.layout.mode:
        raise ChangeRefused(f"layout.mode: {current.layout.mode} -> {new.layout.mode} cannot change live: stop the "
                            "service and serve again")
    running = {group_deployment_name(role, i, g): (role, i, g) for role, i, g in current.layout.groups()}
    for role, i, group in new.layout.groups():
        name = group_deployment_name(role, i, group)
        if name not in running:
            continue
        old_role, _, old = running[name]
        changed = sorted(k for k, v in group.model_dump().items() if k != "count" and v != getattr(old, k))
        if old_role != role or changed:
            raise ChangeRefused(f"layout.{role}.{i} ({name}): only count may change on a running group "
                                f"({', '.join(changed) or 'role'} differ); add a new group (another name) instead")
    now = {a.app_name: a for a in replica_apps(current)}
    wanted = {a.app_name: a for a in replica_apps(new)}
    return LayoutChange(current, new, [a for n, a in wanted.items() if n not in now],
                        [a for n, a in now.items() if n not in wanted])


def _router_view() -> dict:
    from ray import serve

    from deployments.app import ROUTER_APP

    return serve.get_app_handle(ROUTER_APP).routing_view.remote().result(timeout_s=30)


def _wait_router(condition: Callable[[dict], bool], what: str) -> dict:
    deadline = time.monotonic() + ROUTER_FOLLOW_S
    while True:
        view = _router_view()
        if condition(view):
            return view
        if time.monotonic() > deadline:
            raise RuntimeError(f"the router did not follow the registry within {ROUTER_FOLLOW_S:g} s ({what})")
        time.sleep(0.2)


def _entries() -> dict[str, tuple[WorkerEndpoint, str]]:
    import ray

    from orchestrator.cluster.registry import get_registry

    return {e.name: (e, state) for e, state in ray.get(get_registry().entries.remote(), timeout=30)}


def remove_replica(app: "ReplicaApp", drain_s: float, say: Callable[[str], None]) -> dict:
    """Retire `app`'s worker from routing, drain it (router legs and engine gauges at 0), delete its application."""
    import ray
    from ray import serve

    from orchestrator.cluster.registry import get_registry

    name = app.worker_name
    entry = _entries().get(name)
    record: dict = {"name": name, "app": app.app_name}
    if entry is not None:
        ray.get(get_registry().retire.remote(name), timeout=30)
        _wait_router(lambda v: name not in v["workers"], f"retire {name}")
        started = time.monotonic()
        record["requests_at_retire"] = (engine_counts(entry[0]) or (None, None))[0]
        held = None
        while time.monotonic() - started < drain_s:
            legs = _router_view()["legs_in_flight"].get(name, 0)
            counts = engine_counts(entry[0])
            held = legs + (counts[1] if counts else 0)
            if not held:
                break
            time.sleep(0.2)
        record.update(drain_s=round(time.monotonic() - started, 2), cut_off=held or 0,
                      requests_at_drained=(engine_counts(entry[0]) or (None, None))[0])
        say(f"retired {name}: out of routing at {record['requests_at_retire']} requests; "
            + (f"drained in {record['drain_s']:.1f} s at {record['requests_at_drained']} requests" if not held else
               f"drain timed out after {drain_s:g} s: {held} request(s) cut off"))
    serve.delete(app.app_name)
    say(f"removed {name} (application {app.app_name} deleted)")
    return record


def add_replicas(service: "Service", change: LayoutChange, say: Callable[[str], None]) -> list[dict] | None:
    """Place the new replicas held, wait until they registered, warm every new pair, admit them; None on failure
    (the new replicas are removed again, the running ones keep serving)."""
    import ray
    from ray import serve

    from deployments.app import PlacementError, build_replica_apps, run_targets
    from orchestrator.cluster.registry import get_registry

    names = {a.worker_name for a in change.added}
    started = time.monotonic()
    try:
        run_targets(build_replica_apps(change.new, service.run_id, change.added, held=True),
                    timeout_s=change.new.benchmark.deadline_s)
        say(f"placed {', '.join(sorted(names))} in {time.monotonic() - started:.1f} s (held out of routing)")
        deadline = time.monotonic() + change.new.benchmark.deadline_s
        while not names <= set(_entries()):
            if time.monotonic() > deadline:
                raise PlacementError(f"not registered after {change.new.benchmark.deadline_s:g} s: "
                                     f"{sorted(names - set(_entries()))}; see the engine logs")
            time.sleep(0.5)
        say(f"loaded {', '.join(sorted(names))} in {time.monotonic() - started:.1f} s")
        entries = _entries()
        usable = [e for e, state in entries.values() if state != "retired"]
        warmed = asyncio.run(warm_pairs(pairs_touching(usable, names)))
        for w in warmed:
            say(w.line())
        if any(w.error for w in warmed):
            raise PlacementError(f"{sum(1 for w in warmed if w.error)} of {len(warmed)} new pair warm-ups failed")
    except Exception as exc:
        say(f"apply: adding failed: {exc}; removing the new replicas, the running ones keep serving")
        for app in change.added:
            serve.delete(app.app_name)
        return None
    records = []
    for name in sorted(names):
        requests = (engine_counts(entries[name][0]) or (None, None))[0]
        mine = [w for w in warmed if name in (w.prefill, w.decode)]
        records.append({"name": name, "pair_warmups": [w.__dict__ for w in mine],
                        "requests_before_admission": requests})
        say(f"admitting {name}: {requests} request(s) before admission = its {len(mine)} pair warm-up(s)")
        ray.get(get_registry().admit.remote(name), timeout=30)
    view = _wait_router(lambda v: names <= set(v["workers"]), "admit")
    say(f"admitted {', '.join(sorted(names))}: routed from registry version {view['registry_version']}")
    return records


def admit_replacements(service: "Service", say: Callable[[str], None], not_before: dict[str, float]) -> list[dict]:
    """Warm the pairs of every held worker no layout change is placing (a replica Serve started in place of a dead
    one registers held) and admit those whose pairs all answered; `not_before`: worker -> when to try again after a
    failed warm-up. Returns a record per admitted worker."""
    import ray

    from orchestrator.cluster.registry import get_registry

    if not service.change_lock.acquire(blocking=False):  # `serve apply` warms and admits its own replicas
        return []
    try:
        entries = _entries()
        now = time.monotonic()
        held = {name for name, (_, state) in entries.items() if state == "held" and not_before.get(name, 0) <= now}
        if not held:
            return []
        usable = [e for e, state in entries.values() if state != "retired"]
        warmed = asyncio.run(warm_pairs(pairs_touching(usable, held)))
        records = []
        for name in sorted(held):
            mine = [w for w in warmed if name in (w.prefill, w.decode)]
            for w in mine:
                say(w.line())
            failed = [w for w in mine if w.error]
            if failed or not mine:
                not_before[name] = time.monotonic() + READMIT_RETRY_S
                say(f"replacement {name}: {len(failed)} of {len(mine)} pair warm-up(s) failed; kept out of routing, "
                    f"trying again in {READMIT_RETRY_S:g} s" if mine else
                    f"replacement {name}: no pair to warm yet (no routed worker of the other role); kept out of routing")
                continue
            requests = (engine_counts(entries[name][0]) or (None, None))[0]
            ray.get(get_registry().admit.remote(name), timeout=30)
            not_before.pop(name, None)
            say(f"admitted replacement {name} ({entries[name][0].url}): {requests} request(s) before admission = its "
                f"{len(mine)} pair warm-up(s)")
            records.append({"at": time.time(), "name": name, "url": entries[name][0].url,
                            "pair_warmups": [w.__dict__ for w in mine], "requests_before_admission": requests})
        return records
    finally:
        service.change_lock.release()


def watch_replacements(service: "Service") -> None:
    """While the service serves: admit the replicas Serve restarts, once their pairs are warm (a thread's loop)."""
    not_before: dict[str, float] = {}
    failing: str | None = None
    while service.phase == "serving" and not service.stop_requested:
        time.sleep(READMIT_EVERY_S)
        if service.phase != "serving" or service.stop_requested:
            return
        try:
            service.readmissions += admit_replacements(service, service.say, not_before)
            failing = None
        except Exception as exc:  # the registry or a worker did not answer: try again next round, say it once
            if repr(exc) != failing:
                failing = repr(exc)
                service.say(f"replacement check failed ({type(exc).__name__}: {exc}); trying again")


def apply_layout(service: "Service", config_yaml: str | None, overrides: list[str], say: Callable[[str], None]) -> bool:
    """Check, then make one layout change; False (with the reason said) when refused or failed."""
    from orchestrator.cluster.inventory import ClusterError, check_nodes_fit, node_inventory

    if service.phase != "serving":
        say(f"apply refused: the service is {service.phase}; apply once it serves (`serve status`)")
        return False
    if not service.change_lock.acquire(blocking=False):
        say("apply refused: another layout change is in progress; wait for it (`serve status`)")
        return False
    try:
        try:
            change = plan_change(service.cfg, new_config(service.cfg, config_yaml, overrides))
            check_nodes_fit(change.new, node_inventory())
        except ChangeRefused as exc:
            say(f"apply refused: {exc}; the service keeps serving {service.cfg.layout.describe()}")
            return False
        except ClusterError as exc:
            say(f"apply refused: {str(exc).replace(chr(10) + '  ', ' ').replace(chr(10), ' ')}; the service keeps "
                f"serving {service.cfg.layout.describe()}")
            return False
        if not change.added and not change.removed:
            say(f"apply: the layout is unchanged ({service.cfg.layout.describe()}); nothing to do")
            return True
        return _make_change(service, change, say)
    finally:
        service.change_lock.release()


def _make_change(service: "Service", change: LayoutChange, say: Callable[[str], None]) -> bool:
    started = time.monotonic()
    say(f"apply: {change.current.layout.describe()} -> {change.new.layout.describe()}: add "
        f"{[a.worker_name for a in change.added] or 'none'}, remove {[a.worker_name for a in change.removed] or 'none'}")
    added_roles = {a.role for a in change.added}
    routed_roles = [e.role for e, state in _entries().values() if state == "routed"]
    first, later = [], []
    for app in change.removed:  # never leave a role with no routed worker while its successor loads
        if routed_roles.count(app.role) <= 1 and app.role in added_roles:
            later.append(app)
        else:
            first.append(app)
            routed_roles.remove(app.role)
    removed = [remove_replica(app, service.drain_s, say) for app in first]
    added = add_replicas(service, change, say) if change.added else []
    if added is None:
        service.changes.append({"from": change.current.layout.describe(), "to": None, "removed": removed,
                                "added": [], "failed": True})
        return False
    removed += [remove_replica(app, service.drain_s, say) for app in later]
    service.cfg = change.new
    service.changes.append({"at": time.time(), "from": change.current.layout.describe(),
                            "to": change.new.layout.describe(), "added": added, "removed": removed,
                            "seconds": round(time.monotonic() - started, 1)})
    say(f"apply: done in {time.monotonic() - started:.1f} s: serving {change.new.layout.describe()}")
    return True
