"""Node inventory (alive nodes, labels, GPUs) and the check that a layout's workers fit the nodes by role."""

from __future__ import annotations

import os
from dataclasses import dataclass

from orchestrator.config import RunConfig


class ClusterError(RuntimeError):
    """The cluster cannot host the layout, or a local cluster failed to start; the message says the fix."""


def machine_gpus() -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES if set, else every GPU the NVIDIA driver lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def gpu_slices(gpus: list[str], per_node: int, roles: list[str]) -> dict[str, list[str]]:
    """Each local node's own GPUs, in node order; {} when the machine has none (logical GPUs only)."""
    if not gpus:
        return {}
    need = per_node * len(roles)
    if len(gpus) < need:
        raise ClusterError(
            f"cluster.gpus_per_node={per_node}: {len(roles)} local nodes need {need} GPUs, this machine has "
            f"{len(gpus)} ({','.join(gpus)}); set cluster.gpus_per_node: {len(gpus) // len(roles) or 1}"
            + ("" if len(gpus) >= len(roles) else " and cluster.local.gpu_split: off (then the nodes share GPUs)")
        )
    return {role: gpus[i * per_node:(i + 1) * per_node] for i, role in enumerate(roles)}


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    ip: str
    labels: dict[str, str]
    gpus: float
    cpus: float
    gpu_type: str | None = None


def node_inventory() -> list[NodeInfo]:
    """Alive nodes of the connected cluster with labels and resources (for checks and the run report)."""
    import ray

    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        gpu_type = next((k.removeprefix("accelerator_type:") for k in res if k.startswith("accelerator_type:")), None)
        out.append(
            NodeInfo(
                node_id=n["NodeID"],
                ip=n.get("NodeManagerAddress", ""),
                labels={k: v for k, v in (n.get("Labels") or {}).items() if not k.startswith("ray.io/")},
                gpus=float(res.get("GPU", 0)),
                cpus=float(res.get("CPU", 0)),
                gpu_type=gpu_type,
            )
        )
    return out


def check_nodes_fit(cfg: RunConfig, nodes: list[NodeInfo]) -> None:
    """Raise ClusterError before placing anything if a role has no node or too few GPUs."""
    problems = placement_problems(cfg, nodes) + _router_host_problems(cfg, nodes)
    if problems:
        raise ClusterError("cluster cannot host the layout:\n  " + "\n  ".join(problems))


def check_declared_placement(cfg: RunConfig) -> None:
    """The same check against the nodes the config declares (`plan`, `config validate`, bench's preflight):
    ClusterError, one line per group that cannot be placed, naming the group and the fix."""
    problems = placement_problems(cfg, declared_nodes(cfg))
    if problems:
        raise ClusterError("\n".join(problems))


def declared_nodes(cfg: RunConfig) -> list[NodeInfo]:
    """The nodes the config says the cluster has, before any cluster exists. `local`: the two raylets the local
    cluster starts, one per PD role (cluster.roles.prefill, then decode), cluster.gpus_per_node GPUs each. At an
    address: cluster.num_nodes nodes of cluster.gpus_per_node GPUs, each role label on as many nodes as its groups
    need while nodes last (the real labels are checked at placement)."""
    c = cfg.cluster
    if c.is_local:
        labels = [c.roles.prefill, c.roles.decode]
    else:
        gpus: dict[str, int] = {}  # role label -> GPUs its servers take on their first node
        for role, _, group in cfg.layout.groups():
            value = cfg.node_role(role, group)
            gpus[value] = gpus.get(value, 0) + group.gpus_per_node * group.count
        wanted = {value: max(1, -(-n // c.gpus_per_node)) for value, n in gpus.items()}
        labels = list(wanted)[:c.num_nodes]  # one node per role first, then each role's further nodes in turn
        labels += [value for value in wanted for _ in range(wanted[value] - 1)][:c.num_nodes - len(labels)]
        labels += labels[:1] * (c.num_nodes - len(labels))
    return [NodeInfo(f"declared-{i}", "", {c.roles.label_key: value}, float(c.gpus_per_node), 0.0, c.gpu)
            for i, value in enumerate(labels)]


def placement_problems(cfg: RunConfig, nodes: list[NodeInfo]) -> list[str]:
    """One line per worker group that the nodes cannot host by role label and GPU count, with the fix."""
    key = cfg.cluster.roles.label_key
    need: dict[str, list[tuple[str, int, int]]] = {}  # role value -> [(group path, per-node GPUs, servers)]
    problems = []
    for role, i, group in cfg.layout.groups():
        value = cfg.node_role(role, group)
        per_node = group.gpus_per_node
        path = f"layout.{role}.{i}"
        # rank 0 of every server needs a node of its role; further ranks of a multi-node server any node
        need.setdefault(value, []).append((path, per_node, group.count))
        wide = sum(n.gpus >= per_node for n in nodes)
        if group.nnodes > 1 and wide < group.nnodes:
            problems.append(
                f"{path}: one server spans {group.nnodes} nodes with {per_node} GPUs each, but only {wide} node(s) "
                f"have that many; lower {path}.nnodes or add nodes"
            )
    for value, groups in need.items():
        labelled = [n for n in nodes if n.labels.get(key) == value]
        if not labelled:
            problems.append(
                f"no node labelled {key}={value}; start one with "
                f"`ray start --address=<head> --labels {key}={value} --num-gpus=<n>`"
                + ("" if cfg.cluster.is_local else f", or set node_role on the groups that ask for {key}={value}")
            )
            continue
        slots = {n.node_id: int(n.gpus) for n in labelled}
        # first-fit in descending size order: how Ray's STRICT_PACK groups fill nodes, close enough to tell
        for path, per_node, servers in sorted(groups, key=lambda g: -g[1]):
            placed = 0
            for _ in range(servers):
                node = next((nid for nid, free in slots.items() if free >= per_node), None)
                if node is None:
                    problems.append(_group_does_not_fit(cfg, path, per_node, servers, placed, value, labelled,
                                                        shared=len(groups) > 1))
                    break
                slots[node] -= per_node
                placed += 1
    return problems


def _group_does_not_fit(cfg: RunConfig, path: str, per_node: int, servers: int, placed: int, value: str,
                        labelled: list[NodeInfo], shared: bool) -> str:
    key = cfg.cluster.roles.label_key
    if all(n.ip for n in labelled):
        have = ", ".join(f"{n.ip}: {int(n.gpus)} GPUs" for n in labelled)
    else:
        have = f"{len(labelled)} node x {int(labelled[0].gpus)} GPUs" if len(labelled) == 1 else \
            f"{len(labelled)} nodes x {int(labelled[0].gpus)} GPUs"
    if shared:
        have += ", shared with the role's other groups"
    shrink = f"set {path}.count={placed} or a smaller tp" if placed else f"set a smaller {path}.tp"
    grow = (f"attach to a cluster with more nodes labelled {key}={value} (cluster.address; `local` starts one "
            "node per role)") if cfg.cluster.is_local else f"add a node labelled {key}={value}"
    return (f"{path}: {servers} server(s) x {per_node} GPUs do not fit the nodes labelled {key}={value} ({have}): "
            f"{placed} fit; {shrink}, or {grow}")


def router_node_ip(cfg: RunConfig) -> str | None:
    """The node address `router.host` names, if it names one: the router replica must run on that node to
    bind it. None for a wildcard (0.0.0.0, ::), loopback (every node has it) or a hostname."""
    return router_pin_ip(cfg, driver_ip=None)


def router_pin_ip(cfg: RunConfig, driver_ip: str | None) -> str | None:
    """The node the router replica runs on: the one whose address router.host names; for a wildcard or
    loopback router.host, the driver's own node `driver_ip`. Loopback: only there can the driver reach it.
    Wildcard: left to Serve, the router could land on a worker node and a decode node lost mid-run would
    take the router, and every prompt in flight, with it. None (unpinned) for a hostname."""
    import ipaddress

    try:
        ip = ipaddress.ip_address(cfg.router.host)
    except ValueError:
        return None
    return driver_ip if ip.is_unspecified or ip.is_loopback else str(ip)


def driver_node_ip() -> str | None:
    """The address of the node this connected driver runs on (None if Ray does not list it)."""
    import ray

    try:
        node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # e.g. a Ray Client driver has no node of its own: the router stays unpinned
        return None
    return next((n.ip for n in node_inventory() if n.node_id == node_id), None)


def _router_host_problems(cfg: RunConfig, nodes: list[NodeInfo]) -> list[str]:
    """router.host naming an address no node has: the router replica (pinned there) could never start."""
    ip = router_node_ip(cfg)
    if ip is None or any(n.ip == ip for n in nodes):
        return []
    return [f"router.host={ip} is not the address of any node ({', '.join(sorted(n.ip for n in nodes))}); "
            "set router.host to one node's address (the router runs there) or 0.0.0.0"]
