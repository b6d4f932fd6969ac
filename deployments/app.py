"""Config -> Serve applications: `router (ingress, on router.host's node or the driver's) -> registry <-
EngineWorker[group]`.

Each worker group is its own application (no HTTP route) holding one `EngineWorker` deployment whose
replicas are pinned to nodes of their role by label, with one placement group per replica reserving
its GPUs. The router application is the HTTP ingress; it finds workers through the registry, so it
does not need the worker deployments bound into its graph.

`serve` deploys one application per replica instead (`workers-<group>-<k>`, one replica each), so a live layout
change adds or removes exactly the replicas it names (Serve would pick which replica of a group to stop).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ray import serve
from ray.serve.api import RunTarget

from orchestrator.cluster.inventory import driver_node_ip, router_pin_ip
from orchestrator.config import RunConfig, WorkerGroup
from orchestrator.config.server_spec import server_spec
from orchestrator.records import Role

ROUTER_APP = "pd-router"
HEALTH_CHECK_PERIOD_S = 10.0


@dataclass(frozen=True)
class WorkerGroupSpec:
    """One worker group as deployed: Serve app/deployment name, role, node label, replica count."""

    app_name: str
    deployment: str
    role: Role
    group_index: int
    node_label: str
    replicas: int


def group_deployment_name(role: Role, index: int, group: WorkerGroup) -> str:
    return group.name or f"{role}-{index}"


def worker_groups(cfg: RunConfig) -> list[WorkerGroupSpec]:
    specs = []
    for role, i, group in cfg.layout.groups():
        name = group_deployment_name(role, i, group)
        specs.append(WorkerGroupSpec(f"workers-{name}", name, role, i, cfg.node_role(role, group), group.count))
    return specs


def expected_workers(cfg: RunConfig) -> dict[str, int]:
    """Replicas per role the router must see registered before the benchmark starts."""
    out: dict[str, int] = {}
    for spec in worker_groups(cfg):
        out[spec.role] = out.get(spec.role, 0) + spec.replicas
    return out


def worker_deployment_options(cfg: RunConfig, role: Role, group: WorkerGroup) -> dict:
    """Serve options pinning one group's replicas: label selector + one placement group per replica.

    One bundle per GPU (TP ranks are GPUs) packed on one node; a server spanning nodes gets one bundle
    per node (that node's share of the server's GPUs), strictly on different nodes. The replica itself takes no CPU/GPU: it sits in bundle 0
    and only supervises the engine process.
    """
    selector = {cfg.cluster.roles.label_key: cfg.node_role(role, group)}
    shape = server_spec(cfg, role, group).parallel  # the GPUs the launched server's flags ask for
    if shape.nnodes == 1:
        bundles = [{"GPU": 1, "CPU": 0}] * shape.gpus
        strategy = "STRICT_PACK"
    else:
        bundles = [{"GPU": shape.gpus_per_node, "CPU": 0}] * shape.nnodes
        strategy = "STRICT_SPREAD"
    # node rank 0 (bundle 0, where the replica runs) sits on a node of the group's role; the other
    # ranks of a multi-node server take whole other nodes, whatever their label
    bundle_selectors = [selector] + [{}] * (len(bundles) - 1) if shape.nnodes > 1 else [selector]
    return {
        "num_replicas": group.count,
        "ray_actor_options": {"num_cpus": 0, "label_selector": selector},
        "placement_group_bundles": bundles,
        "placement_group_strategy": strategy,
        "placement_group_bundle_label_selector": bundle_selectors,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
        "max_ongoing_requests": 16,  # control calls only; requests go straight to the engine over HTTP
    }


def build_worker_apps(cfg: RunConfig, run_id: str) -> list[RunTarget]:
    from deployments.worker import engine_worker_deployment

    targets = []
    for spec in worker_groups(cfg):
        group = getattr(cfg.layout, spec.role)[spec.group_index]
        deployment = engine_worker_deployment(spec.deployment, **worker_deployment_options(cfg, spec.role, group))
        app = deployment.bind(cfg, spec.role, spec.group_index, run_id)
        targets.append(RunTarget(target=app, name=spec.app_name, route_prefix=None))
    return targets


def router_actor_options(cfg: RunConfig, driver_ip: str | None) -> dict:
    """No CPU; pinned (Ray gives every node a `node:<IP>` resource of 1) to the node whose address
    router.host names, or for a wildcard or loopback router.host to the driver's node (`router_pin_ip`)."""
    ip = router_pin_ip(cfg, driver_ip)
    return {"num_cpus": 0, **({"resources": {f"node:{ip}": 0.001}} if ip else {})}


@dataclass(frozen=True)
class ReplicaApp:
    """One worker replica deployed as its own application (`serve`): worker name `<group>/<index>`."""

    app_name: str
    group: str  # the group's deployment name, e.g. decode-0
    role: Role
    group_index: int
    replica_index: int

    @property
    def worker_name(self) -> str:
        return f"{self.group}/{self.replica_index}"


def replica_apps(cfg: RunConfig) -> list[ReplicaApp]:
    """Every replica of the layout as its own application, `workers-<group>-<k>` for k < the group's count."""
    return [ReplicaApp(f"{spec.app_name}-{k}", spec.deployment, spec.role, spec.group_index, k)
            for spec in worker_groups(cfg) for k in range(spec.replicas)]


def build_replica_apps(cfg: RunConfig, run_id: str, apps: list[ReplicaApp], held: bool = False) -> list[RunTarget]:
    """`apps` as Serve applications of one replica each; `held`: their workers wait for `admit` before routing."""
    from deployments.worker import engine_worker_deployment

    targets = []
    for app in apps:
        group = getattr(cfg.layout, app.role)[app.group_index]
        options = {**worker_deployment_options(cfg, app.role, group), "num_replicas": 1}
        deployment = engine_worker_deployment(app.group, **options)
        bound = deployment.bind(cfg, app.role, app.group_index, run_id, app.replica_index, held)
        targets.append(RunTarget(target=bound, name=app.app_name, route_prefix=None))
    return targets


def build_app(cfg: RunConfig, run_id: str) -> serve.Application:
    """The router application (HTTP ingress + benchmark handle); on router.host's node or the driver's,
    takes no CPU."""
    from deployments.router import PDRouter

    router = PDRouter.options(  # type: ignore[attr-defined]  # @serve.deployment made it a Deployment
        ray_actor_options=router_actor_options(cfg, driver_node_ip()))
    return router.bind(cfg, run_id)


def start_serve(cfg: RunConfig) -> None:
    serve.start(
        http_options={"host": cfg.router.host, "port": cfg.router.port},
        proxy_location="Disabled",  # the router replica serves router.host:router.port itself
    )


class PlacementError(RuntimeError):
    """A Serve application failed to deploy or its replicas could not be placed in time."""


def deploy(cfg: RunConfig, run_id: str, timeout_s: float, with_router: bool = True, per_replica: bool = False,
           on_step: Callable[[str], None] | None = None) -> None:
    """Deploy worker apps (and the router), returning once every replica is constructed; `per_replica`: one
    application per replica (`serve`), else one per group. `on_step(name)` is called as "serve start" and
    "replicas" end (bench's placement steps).

    Replicas return from __init__ right after launching their engine, so this measures placement;
    engine readiness is the router's `wait_ready`. Unplaceable replicas (no GPUs left on a labelled
    node) would wait forever, so we poll Serve's status with a timeout and report what is pending.
    """
    start_serve(cfg)
    if on_step is not None:
        on_step("serve start")
    if per_replica:
        targets = build_replica_apps(cfg, run_id, replica_apps(cfg))
    else:
        targets = build_worker_apps(cfg, run_id)
    if with_router:
        targets.append(RunTarget(target=build_app(cfg, run_id), name=ROUTER_APP, route_prefix=None))
    run_targets(targets, timeout_s)
    if on_step is not None:
        on_step("replicas")


def run_targets(targets: list[RunTarget], timeout_s: float) -> None:
    """Deploy `targets` (other applications keep running) and wait until each is RUNNING; PlacementError names
    what is still pending after `timeout_s` or failed."""
    serve.run_many(targets, wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
    names = [t.name for t in targets]
    deadline = time.monotonic() + timeout_s
    while True:
        apps = serve.status().applications
        failed = [(n, apps[n]) for n in names if n in apps and apps[n].status == "DEPLOY_FAILED"]
        if failed:
            name, app = failed[0]
            raise PlacementError(f"Serve application {name} failed to deploy: {app.message}")
        if all(n in apps and apps[n].status == "RUNNING" for n in names):
            return
        if time.monotonic() > deadline:
            pending = {n: (apps[n].status if n in apps else "NOT_STARTED") for n in names}
            raise PlacementError(
                f"replicas not placed after {timeout_s:.0f}s: {pending}; check that nodes labelled with the "
                "group roles have free GPUs (`ray status`, `pd-orchestrator cluster status`)"
            )
        time.sleep(0.5)
