"""Layout search: enumerate layouts of the cluster, drop those that do not fit, rank the rest by simulated throughput.

config (cluster, model, batch) -> candidates (PD prefill-node x decode-node splits, TP/DP per group;
aggregated TP16 / per-node TPn / DP attention / TP8xPP2) -> memory preflight -> simulate + deadline
-> ranked `Candidate`s -> top ones written as ready RunConfig YAML files. The planner only returns
layouts; it never launches anything.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.config import RunConfig, config_from_dict
from orchestrator.plan.deadline import INVALID, DeadlineBudget, predict_deadline
from orchestrator.plan.memory import MemoryReport, check_layout_fits
from orchestrator.plan.simulate import LABEL

# WorkerGroup has no `pp` field: placement would reserve tp GPUs, not tp x pp, so PP layouts are
# ranked for information but not written as configs.
PP_NOT_WRITABLE = "not written: config has no WorkerGroup.pp, placement would reserve tp GPUs only"


class PlanError(ValueError):
    pass


@dataclass
class Candidate:
    """One layout with its memory verdict and, when it fits, its simulated budget."""

    label: str
    layout: dict
    memory: MemoryReport
    budget: DeadlineBudget | None = None
    note: str = ""

    @property
    def writable(self) -> bool:
        return not self.note

    @property
    def throughput(self) -> float:
        return self.budget.run.output_throughput if self.budget else 0.0


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def enumerate_layouts(cfg: RunConfig) -> list[tuple[str, dict]]:
    """(label, layout dict) for every layout the search considers on cfg's cluster."""
    per_node, nodes = cfg.cluster.gpus_per_node, cfg.cluster.num_nodes
    roles = cfg.cluster.roles
    if nodes not in (1, 2):
        raise PlanError(f"cluster.num_nodes={nodes}: the search enumerates 1- or 2-node clusters (prefill + decode node)")
    out: list[tuple[str, dict]] = []
    # PD: on two nodes prefill takes the prefill node and decode the decode node; on one, half each
    pd_gpus = per_node if nodes == 2 else per_node // 2
    pd_nodes = {} if nodes == 2 else {"node_role": roles.prefill}
    if pd_gpus >= 1:
        tps = _powers_of_two(pd_gpus)
        decode_options = [({"count": pd_gpus // tp, "tp": tp}, f"{pd_gpus // tp}DxTP{tp}") for tp in tps]
        if pd_gpus > 1:
            decode_options.append((
                {"count": 1, "tp": pd_gpus, "dp": pd_gpus, "dp_attention": True}, f"1DxTP{pd_gpus}DP{pd_gpus}-attn"
            ))
        for tp_p in tps:
            prefill = {"count": pd_gpus // tp_p, "tp": tp_p, **pd_nodes}
            for decode, dlabel in decode_options:
                out.append((
                    f"pd {pd_gpus // tp_p}PxTP{tp_p} / {dlabel}",
                    {"mode": "pd", "prefill": [prefill], "decode": [{**decode, **pd_nodes}]},
                ))
    # Aggregated: one server over every node, or servers inside each node (one group per node label)
    node_labels = [roles.prefill, roles.decode] if nodes == 2 else [roles.prefill]
    for tp in _powers_of_two(per_node):
        groups = [{"count": per_node // tp, "tp": tp, "node_role": label} for label in node_labels]
        out.append((f"agg {len(node_labels) * per_node // tp}AxTP{tp}", {"mode": "aggregated", "aggregated": groups}))
    if per_node > 1:
        groups = [
            {"count": 1, "tp": per_node, "dp": per_node, "dp_attention": True, "node_role": label}
            for label in node_labels
        ]
        out.append((f"agg {len(node_labels)}AxTP{per_node}DP{per_node}-attn", {"mode": "aggregated", "aggregated": groups}))
    if nodes == 2:
        span = 2 * per_node
        out.append((f"agg 1AxTP{span}", {"mode": "aggregated", "aggregated": [{"count": 1, "tp": span, "nnodes": 2}]}))
        out.append((
            f"agg 1AxTP{span}DP{span}-attn",
            {"mode": "aggregated", "aggregated": [{"count": 1, "tp": span, "dp": span, "dp_attention": True, "nnodes": 2}]},
        ))
        out.append((
            f"agg 1AxTP{per_node}xPP2",
            {"mode": "aggregated", "aggregated": [{"count": 1, "tp": per_node, "nnodes": 2, "extra_args": ["--pp-size", "2"]}]},
        ))
    return out


def with_layout(cfg: RunConfig, layout: dict, name: str | None = None) -> RunConfig:
    data = cfg.model_dump(mode="json")
    data["layout"] = layout
    if name:
        data["name"] = name
    return config_from_dict(data, f"layout {layout}")


def search_layouts(
    cfg: RunConfig,
    batch: Sequence[tuple[int, int]],
    gpu: str | None = None,
    disk_gb_s: float = 2.0,
    jit_cached: bool = True,
) -> list[Candidate]:
    """Every candidate, ranked: fitting and within the deadline first, by simulated output throughput."""
    gpu = gpu or cfg.cluster.gpu
    candidates = []
    for label, layout in enumerate_layouts(cfg):
        option = with_layout(cfg, layout)
        memory = check_layout_fits(option, batch, gpu=gpu, suggest=False)
        is_pp = any("--pp-size" in g.get("extra_args", []) for g in layout.get("aggregated", []))
        candidate = Candidate(label, layout, memory, note=PP_NOT_WRITABLE if is_pp else "")
        if memory.fits:
            candidate.budget = predict_deadline(option, batch, gpu=gpu, disk_gb_s=disk_gb_s, jit_cached=jit_cached)
        candidates.append(candidate)
    return sorted(
        candidates,
        key=lambda c: (c.budget is None, c.budget is not None and c.budget.verdict == INVALID, -c.throughput),
    )


def ranking_table(candidates: Sequence[Candidate], gpu: str) -> str:
    """One row per candidate: memory verdict, simulated throughput, duration, TTFT/e2e, start-up, deadline."""
    rows = [
        f"{'#':>2} {'layout':<30} {'memory':<20} {'out tok/s':>9} {'run s':>6} {'TTFT p50/p99 s':>15} "
        f"{'e2e p50/p99 s':>14} {'start s':>7} {'total s':>7}  deadline   ({LABEL}, {gpu})"
    ]
    for rank, c in enumerate(candidates, 1):
        if c.budget is None:
            worst = max(c.memory.groups, key=lambda g: g.weights_gb)
            rows.append(f"{rank:>2} {c.label:<30} {c.memory.verdict:<20} (weights {worst.weights_gb:.0f} GB/GPU)")
            continue
        run = c.budget.run
        rows.append(
            f"{rank:>2} {c.label:<30} {c.memory.verdict:<20} {run.output_throughput:>9,.0f} {run.duration_s:>6.1f} "
            f"{run.ttft_p(50):>7.2f}/{run.ttft_p(99):<7.2f} {run.e2e_p(50):>6.1f}/{run.e2e_p(99):<7.1f} "
            f"{c.budget.startup_s:>7.1f} {c.budget.total_s:>7.1f}  {c.budget.verdict}"
            + (f"  [{c.note}]" if c.note else "")
        )
    return "\n".join(rows)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def write_top_configs(
    cfg: RunConfig, candidates: Sequence[Candidate], top: int, write_dir: str | Path, gpu: str
) -> list[Path]:
    """Write the best `top` writable, fitting candidates as RunConfig YAML files; return their paths."""
    out_dir = Path(write_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for c in candidates:
        if len(written) >= top:
            break
        if c.budget is None or not c.writable:
            continue
        rank = len(written) + 1
        name = f"{cfg.name}-plan{rank}-{_slug(c.label)}"
        option = with_layout(cfg, c.layout, name)
        data = option.model_dump(mode="json", exclude_defaults=True)
        data["layout"] = c.layout  # keep the layout literal even where it equals a default
        config_from_dict(data, name)  # what we write must load
        header = (
            f"# Written by `pd-orchestrator plan --search`, rank {rank} on {gpu} ({LABEL}): "
            f"{c.budget.run.output_throughput:,.0f} output tok/s, run {c.budget.run.duration_s:.0f} s, "
            f"total {c.budget.total_s:.0f} s of {c.budget.deadline_s:.0f} s -> {c.budget.verdict}; "
            f"memory {c.memory.verdict}.\n"
        )
        path = out_dir / f"{name}.yaml"
        path.write_text(header + yaml.safe_dump(data, sort_keys=False))
        written.append(path)
    return written
