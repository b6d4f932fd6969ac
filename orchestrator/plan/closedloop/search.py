"""`plan --search` for a closed-loop workload: PD layouts ranked by predicted good output tok/s at the best N that
clears the SLA gate.

config (2 nodes, closed-loop benchmark[, rules]) -> `closed_loop_layouts`: P:D GPU splits 4:12, 8:8, 12:4 x per-role
TP (2/4/8), prefill EP, decode EP / DP attention -> placement and memory prune -> per layout, N ascending over
the declared list until the gate first fails (good fraction falls as N grows; one failing N ends that layout) ->
ranked: layouts that clear the gate by good tok/s at their best N, then the rest by good fraction -> the best few
also with an FP8 KV cache (engine.sglang.kv_cache_dtype, equal on both roles). With rules, only compliant layouts
are ranked. Every number is simulated; the planner only returns configs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator.cluster.inventory import ClusterError, check_declared_placement
from orchestrator.config import RunConfig, config_from_dict
from orchestrator.plan.closedloop.client import ClosedLoopLoad, simulate_closed_loop
from orchestrator.plan.closedloop.predict import ClosedLoopPoint, best_point
from orchestrator.plan.memory.preflight import check_layout_fits
from orchestrator.plan.simulation.runs import LABEL
from orchestrator.plan.simulation.servers import priced_pairing_search_note
from orchestrator.plan.search import PlanError, rules_settings
from orchestrator.rules import RulesProfile, check_config, load_profile

TPS = (2, 4, 8)
CLOSED_LOOP_KEYS = ("kind", "input_tokens", "output_tokens", "concurrency", "warmup_s", "window_s", "grace_s", "slo",
                    "seed")
FP8_KV = "fp8_e4m3"
KV_VARIANTS_OF_BEST = 3  # the best layouts are tried again with an FP8 KV cache


@dataclass
class Ranked:
    """One layout's closed-loop prediction: every N tried (ascending, up to the first that fails the gate)."""

    label: str
    config: RunConfig
    points: list[ClosedLoopPoint]
    equivalents: list[str] = field(default_factory=list)  # layouts with the very same prediction, folded here

    @property
    def best(self) -> ClosedLoopPoint | None:
        return best_point(self.points)

    def sort_key(self) -> tuple:
        best = self.best
        if best is not None:
            return (0, -best.good_output_tok_s, best.concurrency)
        return (1, -max((p.good_fraction for p in self.points), default=0.0),
                -max((p.output_tok_s for p in self.points), default=0.0))


def _role_options(role: str, gpus: int, node_roles: Sequence[str]) -> list[tuple[str, list[dict]]]:
    """(label, groups) for one role holding `gpus` GPUs spread over `node_roles` (8 GPUs a node, the last may
    hold 4): every TP that divides each node's share, prefill with EP on or off, decode plain / EP / DP attention."""
    shares = [8] * (gpus // 8) + ([gpus % 8] if gpus % 8 else [])
    out = []
    for tp in TPS:
        if any(share % tp for share in shares):
            continue
        shapes: list[tuple[str, dict]] = [("", {})]
        if tp > 1:
            shapes.append((f"EP{tp}", {"ep": tp}))
            if role == "decode":
                shapes += [(f"DP{tp}-attn", {"dp": tp, "dp_attention": True}),
                           (f"DP{tp}-attn-EP{tp}", {"dp": tp, "dp_attention": True, "ep": tp})]
        for tag, shape in shapes:
            groups = [{"count": share // tp, "tp": tp, "node_role": node, **shape} for share, node in zip(shares, node_roles)]
            out.append((f"{gpus // tp}{role[0].upper()}xTP{tp}{tag}", groups))
    return out


def closed_loop_layouts(cfg: RunConfig) -> list[tuple[str, dict]]:
    """(label, layout dict) of every PD layout on 2 x 8 GPUs the closed-loop search considers."""
    if cfg.cluster.num_nodes != 2 or cfg.cluster.gpus_per_node != 8:
        raise PlanError(f"the closed-loop search enumerates 2 nodes x 8 GPUs (cluster.num_nodes=2, gpus_per_node=8); "
                        f"got {cfg.cluster.num_nodes} x {cfg.cluster.gpus_per_node}")
    p_node, d_node = cfg.cluster.roles.prefill, cfg.cluster.roles.decode
    # prefill fills the prefill node first, decode the decode node; the split's remainder shares a node
    splits = {4: ([p_node], [p_node, d_node]), 8: ([p_node], [d_node]), 12: ([p_node, d_node], [d_node])}
    out = []
    for prefill_gpus, (p_nodes, d_nodes) in splits.items():
        decode_gpus = 16 - prefill_gpus
        d_order = d_nodes[::-1] if prefill_gpus == 4 else d_nodes  # the 8-GPU share first
        for p_label, prefill in _role_options("prefill", prefill_gpus, p_nodes):
            for d_label, decode in _role_options("decode", decode_gpus, d_order):
                out.append((f"{prefill_gpus}:{decode_gpus} {p_label} / {d_label}",
                            {"mode": "pd", "prefill": prefill, "decode": decode}))
    return out


@dataclass
class ClosedLoopSearch:
    ranked: list[Ranked]
    layouts: int
    pruned: int  # placement or memory
    not_compliant: int
    notes: list[str]


def _evaluate(cfg: RunConfig, concurrencies: Sequence[int], gpu: str) -> list[ClosedLoopPoint]:
    points: list[ClosedLoopPoint] = []
    for n in concurrencies:
        points.append(ClosedLoopPoint(n, simulate_closed_loop(cfg, ClosedLoopLoad.of(cfg, n), gpu), cfg.benchmark.slo))
        if not points[-1].clears_gate:
            break
    return points


def _closed_loop_rules(cfg: RunConfig, rules: RulesProfile | None) -> tuple[RunConfig, list[str]]:
    """rules_settings plus the closed-loop measurement a profile fixes (kind, ISL/OSL, window, SLO)."""
    cfg, notes = rules_settings(cfg, rules)
    if rules is None:
        return cfg, notes
    data = cfg.model_dump(mode="json")
    bench, fixed = data["benchmark"], rules.benchmark.closed_loop.model_dump()
    for name, value in fixed.items():
        node = bench["slo"] if name in ("ttft_ms", "itl_ms", "min_good_fraction") else bench
        if value is not None and node[name] != value:
            notes.append(f"benchmark.{'slo.' if node is not bench else ''}{name}: {node[name]!r} -> {value!r} "
                         "(the contest's command)")
            node[name] = value
    return config_from_dict(data, f"rules {rules.name}"), notes


def closed_loop_search(cfg: RunConfig, gpu: str | None = None, rules: RulesProfile | None = None,
                       concurrencies: Sequence[int] | None = None) -> ClosedLoopSearch:
    gpu = gpu or cfg.cluster.gpu
    cfg, notes = _closed_loop_rules(cfg, rules)
    ns = sorted(set(concurrencies or cfg.benchmark.concurrency))
    layouts = closed_loop_layouts(cfg)
    base = cfg.model_dump(mode="json")
    evaluated: list[Ranked] = []
    pruned = not_compliant = 0
    for label, layout in layouts:
        data = json.loads(json.dumps(base))
        data["layout"] = layout
        try:
            candidate = config_from_dict(data, label)
            check_declared_placement(candidate)
        except (ValueError, ClusterError):
            pruned += 1
            continue
        if rules is not None and not check_config(candidate, rules).compliant:
            not_compliant += 1
            continue
        shapes = [(candidate.benchmark.input_tokens, candidate.benchmark.output_tokens)] * max(ns)
        if not check_layout_fits(candidate, shapes, gpu=gpu, suggest=False).fits:
            pruned += 1
            continue
        evaluated.append(Ranked(label, candidate, _evaluate(candidate, ns, gpu)))
    evaluated.sort(key=Ranked.sort_key)
    if cfg.engine.sglang.kv_cache_dtype != FP8_KV:
        for top in evaluated[:KV_VARIANTS_OF_BEST]:
            data = top.config.model_dump(mode="json")
            data["engine"]["sglang"]["kv_cache_dtype"] = FP8_KV
            variant = config_from_dict(data, top.label)
            if rules is not None and not check_config(variant, rules).compliant:
                continue
            evaluated.append(Ranked(f"{top.label} kv {FP8_KV}", variant, _evaluate(variant, ns, gpu)))
        evaluated.sort(key=Ranked.sort_key)
    return ClosedLoopSearch(_fold_equivalents(evaluated), len(layouts), pruned, not_compliant, notes)


def _signature(r: Ranked) -> tuple:
    return tuple((p.concurrency, round(p.good_output_tok_s, 1), round(p.output_tok_s, 1), round(p.good_fraction, 4))
                 for p in r.points)


def _fold_equivalents(ranked: list[Ranked]) -> list[Ranked]:
    """Layouts predicted identically at every N tried fold into the first (e.g. EP on or off: the cost model does
    not tell them apart); the folded labels are kept on it."""
    kept: dict[tuple, Ranked] = {}
    out = []
    for r in ranked:
        key = _signature(r)
        if key in kept:
            kept[key].equivalents.append(r.label)
            continue
        kept[key] = r
        out.append(r)
    return out


def search_table(result: ClosedLoopSearch, gpu: str, show: int) -> str:
    rows = [f"{'#':>3} {'layout (P:D GPUs, prefill / decode)':<52} {'best N':>6} {'good tok/s':>10} {'good frac':>9} "
            f"{'TTFT p99 ms':>11} {'ITL p50 ms':>10}  gate ({LABEL}, {gpu})"]
    for rank, r in enumerate(result.ranked[:show], 1):
        point = r.best or max(r.points, key=lambda p: p.good_fraction)
        rows.append(f"{rank:>3} {r.label[:52]:<52} {point.concurrency:>6} {point.good_output_tok_s:>10,.0f} "
                    f"{point.good_fraction:>9.3f} {point.run.ttft_ms()['p99']:>11,.0f} {point.run.itl_ms()['p50']:>10.1f}  "
                    f"{'PASS' if r.best else 'FAIL at every N tried'}")
        if r.equivalents:
            more = f" (+{len(r.equivalents) - 3})" if len(r.equivalents) > 3 else ""
            rows.append(f"{'':>4}same prediction: {', '.join(r.equivalents[:3])}{more}")
    if len(result.ranked) > show:
        rows.append(f"... {len(result.ranked) - show} more")
    return "\n".join(rows)


def write_passing(result: ClosedLoopSearch, cfg: RunConfig, gpu: str, top: int, write_dir: str, band: str) -> list[Path]:
    """The best `top` layouts that clear the gate as run configs, each headed by its prediction."""
    out_dir = Path(write_dir)
    written = []
    for rank, r in enumerate([r for r in result.ranked if r.best is not None][:top], 1):
        best = r.best
        assert best is not None
        name = f"{cfg.name}-plan{rank}-" + re.sub(r"[^A-Za-z0-9]+", "-", r.label).strip("-").lower()
        full = r.config.model_dump(mode="json")
        data = r.config.model_dump(mode="json", exclude_defaults=True)
        data["name"] = name
        for section, keys in (("cluster", ("gpu", "gpus_per_node", "num_nodes")), ("model", ("preset", "quantization")),
                              ("benchmark", CLOSED_LOOP_KEYS)):  # spelled out: what the prediction assumed
            data[section] = {**{k: full[section][k] for k in keys}, **data.get(section, {})}
        data = {k: data[k] for k in RunConfig.model_fields if k in data}
        config_from_dict(data, name)  # what we write must load
        header = (f"# Written by `pd-orchestrator plan --search`, rank {rank} on {gpu} ({LABEL}): {r.label}: "
                  f"{best.good_output_tok_s:,.0f} good output tok/s at N={best.concurrency} (good fraction "
                  f"{best.good_fraction:.3f}); error band: {band}.\n")
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{name}.yaml"
        path.write_text(header + yaml.safe_dump(data, sort_keys=False))
        written.append(path)
    return written


def print_closed_loop_search(cfg: RunConfig, gpu: str, rules_name: str | None, concurrencies: Sequence[int] | None,
                             show: int, band: str, top: int = 3, write_dir: str | None = None) -> int:
    """`plan --search` output for a closed-loop config; 0 when some layout clears the gate, else 1."""
    name = rules_name or cfg.rules
    rules = load_profile(name) if name and name.strip().lower() != "none" else None
    result = closed_loop_search(cfg, gpu, rules, concurrencies)
    for note in result.notes:
        print(f"rules {rules.name if rules else ''}: {note}")
    print(f"closed-loop search: {result.layouts} PD layouts, {result.pruned} pruned (placement or memory), "
          f"{result.not_compliant} not compliant, {len(result.ranked)} ranked by good output tok/s at the best N "
          "that clears the gate (N ascending, each layout until its first failing N)\n")
    print(search_table(result, gpu, show))
    if pairing := priced_pairing_search_note([r.config for r in result.ranked]):
        print(f"  {pairing}")
    best = result.ranked[0] if result.ranked else None
    if best is None or best.best is None:
        slo = cfg.benchmark.slo if rules is None else _closed_loop_rules(cfg, rules)[0].benchmark.slo
        itl = min((p.run.itl_ms()["p50"] for r in result.ranked for p in r.points), default=float("nan"))
        print(f"\nno layout clears the gate at any N tried (lowest predicted ITL p50: {itl:.1f} ms vs the SLA's "
              f"{slo.itl_ms:g} ms; band: {band})")
    else:
        print(f"\nbest: {best.label} at N={best.best.concurrency}: {best.best.good_output_tok_s:,.0f} good output tok/s "
              f"({LABEL}); error band: {band}")
    if write_dir:
        written = write_passing(result, cfg, gpu, top, write_dir, band)
        print(f"wrote {len(written)} config(s) to {write_dir}" + (": " + ", ".join(p.name for p in written) if written
                                                                  else " (no layout clears the gate)"))
    return 0 if best is not None and best.best is not None else 1
