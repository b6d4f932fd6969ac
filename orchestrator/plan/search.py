"""Layout and knob search: layouts -> memory prune -> knob descent -> rank by predicted run time in the deadline.

config (cluster, model, batch[, rules]) -> `enumerate_layouts` (PD prefill/decode splits with TP or DP
attention + EP on decode; aggregated: TP per node, TP over both nodes, DP attention + EP, TP x PP) ->
memory preflight (layouts that do not fit are never simulated) -> simulate + deadline budget -> for the best
`tune_top` layouts, one pass of coordinate descent over the knobs (`KNOBS`: batch caps, mem fraction,
chunked prefill, page size, attention backend, speculative decoding, warm-up policy), every value memory-
checked before it is simulated -> every evaluated variant ranked: inside the deadline first, then by
predicted run time (the batch is the same, so that is output throughput), then by total time ->
`why_better` (explain.py) says in one line why each beats the next -> proposals.py writes the top ones as
runnable RunConfig YAML and prints the table.
With a rules profile, only compliant variants are proposed. The planner only returns configs; it never
launches anything.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.config import RunConfig, config_from_dict
from orchestrator.plan.candidate import FIXED_FIELDS, Candidate
from orchestrator.plan.deadline import INVALID, predict_deadline
from orchestrator.plan.explain import why_better
from orchestrator.plan.knobs import KNOBS, base_knobs, knob_text
from orchestrator.plan.memory.preflight import check_layout_fits
from orchestrator.rules import RulesProfile, check_config

# A change of a knob is kept only when it shortens the predicted run by more than this (else the simpler,
# default setting stays), or when it moves the deadline verdict up.
MIN_GAIN = 0.005


class PlanError(ValueError):
    pass


# ------------------------------------------------------------------------------------------ layouts


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
            decode_options.append((
                {"count": 1, "tp": pd_gpus, "dp": pd_gpus, "dp_attention": True, "ep": pd_gpus},
                f"1DxTP{pd_gpus}DP{pd_gpus}-attn-EP{pd_gpus}",
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
        for dp in (2, span):  # attention DP per node (SGLang's 2x8 H100 example) and per GPU
            base = {"count": 1, "tp": span, "dp": dp, "dp_attention": True, "nnodes": 2}
            out.append((f"agg 1AxTP{span}DP{dp}-attn", {"mode": "aggregated", "aggregated": [base]}))
        out.append((
            f"agg 1AxTP{span}DP{span}-attn-EP{span}",
            {"mode": "aggregated", "aggregated": [{"count": 1, "tp": span, "dp": span, "dp_attention": True,
                                                   "ep": span, "nnodes": 2}]},
        ))
        out.append((
            f"agg 1AxTP{per_node}xPP2",
            {"mode": "aggregated", "aggregated": [{"count": 1, "tp": per_node, "pp": 2, "nnodes": 2}]},
        ))
        for dp in sorted({2, per_node} - {1}):  # TP inside each node x PP2 over the nodes x DP attention
            base = {"count": 1, "tp": per_node, "pp": 2, "dp": dp, "dp_attention": True, "nnodes": 2}
            out.append((f"agg 1AxTP{per_node}xPP2DP{dp}-attn", {"mode": "aggregated", "aggregated": [base]}))
    return out


def with_layout(cfg: RunConfig, layout: dict, name: str | None = None) -> RunConfig:
    data = cfg.model_dump(mode="json")
    data["layout"] = layout
    if name:
        data["name"] = name
    return config_from_dict(data, f"layout {layout}")


# ------------------------------------------------------------------------------------------- search


def rules_settings(cfg: RunConfig, rules: RulesProfile | None) -> tuple[RunConfig, list[str]]:
    """The config with the settings a rules profile fixes (precision, load format, prompts, seed, deadline)."""
    if rules is None:
        return cfg, []
    data = cfg.model_dump(mode="json")
    notes = []

    def fix(path: str, value: object, why: str) -> None:
        node = data
        keys = path.split(".")
        for key in keys[:-1]:
            node = node[key]
        if node[keys[-1]] != value:
            notes.append(f"{path}: {node[keys[-1]]!r} -> {value!r} ({why})")
            node[keys[-1]] = value

    if rules.model.checkpoint_precision:
        fix("model.quantization", rules.model.checkpoint_precision, "the checkpoint's own precision")
    if rules.engine.load_format:
        fix("engine.sglang.load_format", rules.engine.load_format, "the contest's load format")
    if rules.model.kv_cache_dtypes and cfg.engine.sglang.kv_cache_dtype not in rules.model.kv_cache_dtypes:
        fix("engine.sglang.kv_cache_dtype", rules.model.kv_cache_dtypes[0], "activations unquantized")
    b = rules.benchmark
    if b.num_prompts:
        fix("benchmark.num_prompts", b.num_prompts, "the contest's prompt count")
    if b.seed is not None:
        fix("benchmark.seed", b.seed, "the contest's seed")
    if b.max_deadline_s and cfg.benchmark.deadline_s > b.max_deadline_s:
        fix("benchmark.deadline_s", b.max_deadline_s, "the contest's limit")
    return config_from_dict(data, f"rules {rules.name}"), notes


@dataclass
class SearchResult:
    """Every evaluated candidate, ranked; counts of what was pruned and why."""

    ranked: list[Candidate]
    layouts: int
    pruned_memory: int
    not_compliant: int
    evaluated: int
    rules: str | None = None
    notes: list[str] = field(default_factory=list)
    standing: list = field(default_factory=list)  # rules violations in FIXED_FIELDS: every layout has them

    @property
    def proposals(self) -> list[Candidate]:
        return [c for c in self.ranked if c.writable and c.budget is not None and c.budget.verdict != INVALID]


class _Evaluator:
    """Memory first, then simulation; results cached by the config's content."""

    def __init__(self, batch, gpu, disk_gb_s, jit_cached, rules):
        self.batch, self.gpu, self.disk_gb_s, self.jit_cached, self.rules = batch, gpu, disk_gb_s, jit_cached, rules
        self.cache: dict[str, Candidate] = {}

    def __call__(self, label: str, knobs: dict, data: dict) -> Candidate | None:
        key = json.dumps(data, sort_keys=True)
        if key in self.cache:
            return self.cache[key]
        try:
            cfg = config_from_dict(data, label)
        except ValueError:
            return None  # a knob value this layout cannot take (e.g. flashmla page size vs a fixed one)
        memory = check_layout_fits(cfg, self.batch, gpu=self.gpu, suggest=False)
        candidate = Candidate(label, dict(knobs), cfg, memory)
        if self.rules is not None:
            candidate.rules = check_config(cfg, self.rules)
        if memory.fits:
            candidate.budget = predict_deadline(cfg, self.batch, gpu=self.gpu, disk_gb_s=self.disk_gb_s,
                                                jit_cached=self.jit_cached)
        self.cache[key] = candidate
        return candidate


def _better(a: Candidate, b: Candidate) -> bool:
    """a is worth a change from b: a better deadline verdict, or a run shorter by more than MIN_GAIN."""
    if a.verdict_rank != b.verdict_rank:
        return a.verdict_rank < b.verdict_rank
    return a.run_s < b.run_s * (1 - MIN_GAIN)


def tune_knobs(evaluate: _Evaluator, start: Candidate) -> list[Candidate]:
    """One pass of coordinate descent from `start` over KNOBS; returns every variant evaluated.

    Each knob's values are tried on the best config so far; a value is kept only if `_better` (and, with
    rules, compliant), so a knob that does not matter stays at its base setting.
    """
    defaults = base_knobs(start.config)
    best, seen = start, [start]
    for knob in KNOBS:
        if knob.pd_only and start.config.layout.mode != "pd":
            continue
        current = {**defaults, **best.knobs}[knob.name]
        for value in knob.values:
            if value == current:
                continue
            data = best.config.model_dump(mode="json")
            knob.apply(data, value)
            knobs = {k: v for k, v in {**best.knobs, knob.name: value}.items() if v != defaults[k]}
            option = evaluate(start.label, knobs, data)
            if option is None:
                continue
            seen.append(option)
            if option.budget is not None and option.compliant and _better(option, best):
                best = option
    return seen


def search(
    cfg: RunConfig,
    batch: Sequence[tuple[int, int]],
    gpu: str | None = None,
    disk_gb_s: float = 2.0,
    jit_cached: bool = True,
    rules: RulesProfile | None = None,
    tune_top: int = 4,
) -> SearchResult:
    """Layouts, pruned by memory, the best `tune_top` tuned over KNOBS; everything evaluated, ranked."""
    gpu = gpu or cfg.cluster.gpu
    cfg, notes = rules_settings(cfg, rules)
    evaluate = _Evaluator(batch, gpu, disk_gb_s, jit_cached, rules)
    layouts = enumerate_layouts(cfg)
    base = cfg.model_dump(mode="json")
    structural = []
    for label, layout in layouts:
        data = json.loads(json.dumps(base))
        data["layout"] = layout
        candidate = evaluate(label, {}, data)
        if candidate is not None:
            structural.append(candidate)
    fitting = sorted((c for c in structural if c.budget is not None and c.compliant),
                     key=Candidate.sort_key)
    for start in fitting[:tune_top]:
        tune_knobs(evaluate, start)
    everything = list(evaluate.cache.values())
    compliant = [c for c in everything if c.compliant]
    ranked = _fold_equivalents(sorted((c for c in compliant if c.budget is not None), key=Candidate.sort_key))
    ranked += [c for c in structural if c.budget is None and c.compliant]
    for a, b in zip(ranked, ranked[1:]):
        if a.budget is not None and b.budget is not None:
            a.why = why_better(a, b)
    return SearchResult(
        ranked=ranked,
        layouts=len(layouts),
        pruned_memory=sum(1 for c in everything if c.budget is None),
        not_compliant=len(everything) - len(compliant),
        evaluated=len(everything),
        rules=rules.name if rules else None,
        notes=notes,
        standing=[] if rules is None else [v for v in check_config(cfg, rules).violations if v.field in FIXED_FIELDS],
    )


def _fold_equivalents(ranked: list[Candidate]) -> list[Candidate]:
    """Variants of one layout with the same verdict and run time fold into the one with fewest changes (a knob
    that only moves start-up or warm-up inside the deadline buys no throughput)."""
    kept: dict[tuple, Candidate] = {}
    out = []
    for c in ranked:
        key = (c.label, c.verdict_rank, round(c.run_s, 1))
        if key in kept:
            kept[key].equivalents.append(knob_text(c.knobs))
            continue
        kept[key] = c
        out.append(c)
    return out


def search_layouts(cfg: RunConfig, batch: Sequence[tuple[int, int]], gpu: str | None = None, disk_gb_s: float = 2.0,
                   jit_cached: bool = True, rules: RulesProfile | None = None, tune_top: int = 4) -> list[Candidate]:
    """The ranked candidates of `search` (fitting ones first, then the layouts that do not fit)."""
    return search(cfg, batch, gpu, disk_gb_s, jit_cached, rules, tune_top).ranked
