"""The lines both plans print before their prediction: the layout against the declared cluster (what bench checks at
placement), and what a group's forwards borrow: another model's profiles (the same per-GPU shard), a lent expert-routing
curve, a graph capture figure of another layer count."""

from __future__ import annotations

from orchestrator.cluster.inventory import ClusterError, check_declared_placement, declared_nodes
from orchestrator.config import RunConfig
from orchestrator.perfmodel.costmodel import cost_model_for


def print_lent_calibration(cfg: RunConfig, gpu: str) -> None:
    """A group priced by another model's profiles (Calibration.shard_note), whose expert reads follow another
    profile's dummy-weight routing curve (lent_routing_note), or whose graph capture is priced at another layer count
    than measured (capture_layers_note), says so."""
    for role, i, group in cfg.layout.groups():
        model = cost_model_for(cfg, role, group, gpu=gpu)
        shard = model.calibration.shard_note() if model.calibration is not None else None
        for note in (shard, model.lent_routing_note(), model.capture_layers_note()):
            if note:
                print(f"  layout.{role}.{i}: {note}")


def print_placement(cfg: RunConfig) -> bool:
    """GPUs per node and role against the declared cluster, the check bench makes at placement; True if it fits."""
    try:
        check_declared_placement(cfg)
    except ClusterError as exc:
        for line in str(exc).splitlines():
            print(f"placement: {line}")
        print("placement: does not fit -> INVALID (memory and deadline not checked)\n")
        return False
    nodes = declared_nodes(cfg)
    key = cfg.cluster.roles.label_key
    roles = ", ".join(f"{key}={v}: {sum(n.labels[key] == v for n in nodes)}" for v in dict.fromkeys(n.labels[key] for n in nodes))
    declared = "" if cfg.cluster.is_local else "; as declared: bench checks the real labels at placement"
    print(f"placement: fits ({len(nodes)} nodes x {cfg.cluster.gpus_per_node} GPUs by role: {roles}{declared})\n")
    return True
