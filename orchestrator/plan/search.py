"""Layout and knob search: layouts -> memory prune -> knob descent -> rank by predicted run time in the deadline.

config (cluster, model, batch[, rules]) -> `enumerate_layouts` (PD prefill/decode splits with TP or DP
attention + EP on decode; aggregated: TP per node, TP over both nodes, DP attention + EP, TP x PP) ->
memory preflight (layouts that do not fit are never simulated) -> simulate + deadline budget -> for the best
`tune_top` layouts, one pass of coordinate descent over the knobs (`KNOBS`: batch caps, mem fraction,
chunked prefill, page size, attention backend, speculative decoding, warm-up policy), every value memory-
checked before it is simulated -> every evaluated variant ranked: inside the deadline first, then by
predicted run time (the batch is the same, so that is output throughput), then by total time ->
`why_better` says in one line why each beats the next -> the top ones written as runnable RunConfig YAML.
With a rules profile, only compliant variants are proposed. The planner only returns configs; it never
launches anything.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator.config import RunConfig, config_from_dict
from orchestrator.plan.deadline import AT_RISK, INVALID, VALID, DeadlineBudget, predict_deadline
from orchestrator.plan.memory import MemoryReport, check_layout_fits
from orchestrator.plan.simulate import LABEL
from orchestrator.rules import RulesProfile, RulesVerdict, check_config
from orchestrator.perfmodel.costmodel import cost_model_for

# Fields the search never changes: a rules violation there is the same for every layout, so it is stated once
# (and in every written config) instead of ruling every layout out.
FIXED_FIELDS = frozenset({"cluster.gpu", "cluster.num_nodes", "cluster.gpus_per_node", "model.preset", "model.path",
                          "benchmark.dataset_path"})
# A change of a knob is kept only when it shortens the predicted run by more than this (else the simpler,
# default setting stays), or when it moves the deadline verdict up.
MIN_GAIN = 0.005
_VERDICT_RANK = {VALID: 0, AT_RISK: 1, INVALID: 2}


class PlanError(ValueError):
    pass


@dataclass
class Candidate:
    """One evaluated config: its layout label, knob settings, memory verdict and, when it fits, its budget."""

    label: str
    knobs: dict[str, object]  # knob name -> value, only where it differs from the base config
    config: RunConfig
    memory: MemoryReport
    budget: DeadlineBudget | None = None
    rules: RulesVerdict | None = None
    why: str = ""  # why it beats the next one in the ranking
    equivalents: list[str] = field(default_factory=list)  # knob settings predicted identical, folded into this row

    @property
    def compliant(self) -> bool:
        """No rules, or no violation the search could avoid (FIXED_FIELDS ones are stated separately)."""
        return self.rules is None or all(v.field in FIXED_FIELDS for v in self.rules.violations)

    @property
    def writable(self) -> bool:
        return self.budget is not None and self.compliant

    @property
    def layout(self) -> dict:
        return self.config.layout.model_dump(mode="json", exclude_defaults=True)

    @property
    def throughput(self) -> float:
        return self.budget.run.output_throughput if self.budget else 0.0

    @property
    def run_s(self) -> float:
        return self.budget.run.duration_s if self.budget else math.inf

    @property
    def total_s(self) -> float:
        return self.budget.total_s if self.budget else math.inf

    @property
    def verdict_rank(self) -> int:
        return _VERDICT_RANK[self.budget.verdict] if self.budget else 3

    @property
    def name(self) -> str:
        return self.label + ("" if not self.knobs else " " + knob_text(self.knobs))

    def sort_key(self) -> tuple:
        """Inside the deadline first; then run time (same batch: output throughput) to 0.1 s; then the fewest
        changed knobs (a change must buy run time); then total time (start-up, warm-up)."""
        return (self.verdict_rank, round(self.run_s, 1), len(self.knobs), self.total_s)


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
    return out


def with_layout(cfg: RunConfig, layout: dict, name: str | None = None) -> RunConfig:
    data = cfg.model_dump(mode="json")
    data["layout"] = layout
    if name:
        data["name"] = name
    return config_from_dict(data, f"layout {layout}")


# -------------------------------------------------------------------------------------------- knobs


def _groups(data: dict, roles: Sequence[str]) -> list[dict]:
    return [g for role in roles for g in data["layout"].get(role) or []]


DECODING = ("decode", "aggregated")  # groups that run decode steps (CUDA graphs, batch caps)
PREFILLING = ("prefill", "aggregated")
ALL = ("prefill", "decode", "aggregated")


def _set_groups(roles: Sequence[str], **fields: object) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        for g in _groups(data, roles):
            g.update(fields)
    return apply


def _set_batch_caps(value: int | None) -> Callable[[dict], None]:
    return _set_groups(DECODING, max_running_requests=value, cuda_graph_max_bs=value)


def _set_attention(value: str | None) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        _set_groups(ALL, attention_backend=value)(data)
        if value == "flashmla":  # SGLang runs FlashMLA at page size 64 only
            data["engine"]["sglang"]["page_size"] = 64
    return apply


def _set_page(value: int) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        data["engine"]["sglang"]["page_size"] = value
    return apply


def _set_speculative(value: tuple[int, int] | None) -> Callable[[dict], None]:
    spec = None if value is None else {"algorithm": "NEXTN", "num_steps": value[0], "eagle_topk": 1,
                                       "num_draft_tokens": value[1]}
    return _set_groups(ALL, speculative=spec)


def _set_warmup(value: str) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        data["benchmark"]["warmup"]["policy"] = value
    return apply


@dataclass(frozen=True)
class Knob:
    """One searched axis: its values (None = SGLang's default) and how each value edits a config dict."""

    name: str
    values: tuple
    setter: Callable[[object], Callable[[dict], None]]
    pd_only: bool = False

    def apply(self, data: dict, value: object) -> None:
        self.setter(value)(data)


KNOBS: tuple[Knob, ...] = (
    Knob("batch_caps", (None, 256, 512, 1024), _set_batch_caps),  # max_running_requests = cuda_graph_max_bs
    Knob("mem_fraction_static", (None, 0.85, 0.88, 0.9, 0.92), lambda v: _set_groups(ALL, mem_fraction_static=v)),
    Knob("chunked_prefill_size", (None, 4096, 16384), lambda v: _set_groups(PREFILLING, chunked_prefill_size=v)),
    Knob("page_size", (1, 64), _set_page, pd_only=True),
    Knob("attention_backend", (None, "triton", "flashmla"), _set_attention),
    Knob("speculative", (None, (1, 2), (3, 4)), _set_speculative),  # R1's MTP: (num_steps, num_draft_tokens)
    Knob("warmup", ("dataset", "sglang", "none"), _set_warmup),
)


def knob_text(knobs: dict[str, object]) -> str:
    """Compact label of non-default knobs, e.g. 'caps=1024 mem=0.9 mtp=3/4'."""
    short = {"batch_caps": "caps", "mem_fraction_static": "mem", "chunked_prefill_size": "chunk",
             "page_size": "page", "attention_backend": "attn", "speculative": "mtp", "warmup": "warmup"}
    parts = []
    for name, value in knobs.items():
        shown = "off" if value is None else f"{value[0]}/{value[1]}" if isinstance(value, tuple) else value
        if name in ("batch_caps", "mem_fraction_static", "chunked_prefill_size", "attention_backend") and value is None:
            shown = "default"
        parts.append(f"{short.get(name, name)}={shown}")
    return " ".join(parts)


def _base_knobs(cfg: RunConfig) -> dict[str, object]:
    """The base config's value of each knob, in KNOBS' terms (what 'no change' means)."""
    deciding = [g for r, _, g in cfg.layout.groups() if r in DECODING]
    caps = deciding[0].cuda_graph_max_bs if deciding and deciding[0].cuda_graph_max_bs == deciding[0].max_running_requests else None
    spec = next((g.speculative for _, _, g in cfg.layout.groups() if g.speculative), None)
    first = cfg.layout.groups()[0][2]
    return {
        "batch_caps": caps,
        "mem_fraction_static": first.mem_fraction_static,
        "chunked_prefill_size": first.chunked_prefill_size,
        "page_size": cfg.engine.sglang.page_size,
        "attention_backend": first.attention_backend,
        "speculative": None if spec is None else (spec.num_steps, spec.num_draft_tokens),
        "warmup": cfg.benchmark.warmup.policy,
    }


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
    defaults = _base_knobs(start.config)
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


# --------------------------------------------------------------------------------------- explaining


def _decoding_model(c: Candidate):
    role, _, group = next((r, i, g) for r, i, g in c.config.layout.groups() if r in DECODING)
    return cost_model_for(c.config, role, group, gpu=c.budget.run.gpu if c.budget else None)


def _kv_tokens(c: Candidate) -> int:
    return sum(cost_model_for(c.config, r, g, gpu=c.budget.run.gpu).kv_capacity_tokens() * g.count
               for r, _, g in c.config.layout.groups() if r in DECODING)


def _caps_text(c: Candidate) -> str:
    role, _, group = next((r, i, g) for r, i, g in c.config.layout.groups() if r in DECODING)
    running = cost_model_for(c.config, role, group, gpu=c.budget.run.gpu).max_running()
    graphs = group.cuda_graph_max_bs or "SGLang's default"
    return f"{running} running requests, CUDA graphs up to batch {graphs}"


def _mechanism(name: str, a: Candidate, b: Candidate) -> str:
    """What a knob difference changes in the model, with the numbers of both candidates."""
    ma, mb = _decoding_model(a), _decoding_model(b)
    if name == "batch_caps":
        return f"decode with {_caps_text(a)} vs {_caps_text(b)} (larger batches run without CUDA graphs)"
    if name == "mem_fraction_static":
        return f"KV holds {_kv_tokens(a):,} vs {_kv_tokens(b):,} tokens (mem fraction {ma.mem_fraction_static:.2f} vs {mb.mem_fraction_static:.2f})"
    if name == "chunked_prefill_size":
        return f"prefill forwards of {ma.chunked_prefill_tokens:,} vs {mb.chunked_prefill_tokens:,} tokens"
    if name == "page_size":
        return f"page size {a.config.engine.sglang.page_size} vs {b.config.engine.sglang.page_size} (KV transfer descriptors)"
    if name == "attention_backend":
        speed = lambda m: getattr(m, "attention_speed", 1.0)  # noqa: E731
        return (f"attention {a.knobs.get(name) or 'fa3'} vs {b.knobs.get(name) or 'fa3'} "
                f"(speed {speed(ma):.2f} vs {speed(mb):.2f}, assumed)")
    if name == "speculative":
        acc = lambda m: "off" if getattr(m, "speculative", None) is None else f"{m.decode_tokens_per_step:.2f} tokens/step"  # noqa: E731
        dummy = " (dummy weights: drafts assumed rejected)" if a.config.engine.sglang.load_format == "dummy" else ""
        return f"MTP {acc(ma)} vs {acc(mb)}{dummy}"
    if name == "warmup":
        return f"warm-up {a.budget.phase_s('warmup'):.1f} vs {b.budget.phase_s('warmup'):.1f} s of the deadline"
    return name


def why_better(a: Candidate, b: Candidate) -> str:
    """One line: why `a` ranks above `b` (deadline verdict, run time, then the differences that cause it)."""
    if a.verdict_rank != b.verdict_rank:
        head = f"{a.budget.verdict} vs {b.budget.verdict} (total {a.total_s:.0f} vs {b.total_s:.0f} s of {a.budget.deadline_s:.0f})"
    elif a.run_s < b.run_s * (1 - 1e-3):
        head = f"run {a.run_s:.1f} vs {b.run_s:.1f} s ({1 - a.run_s / b.run_s:.1%} shorter, {a.throughput:,.0f} vs {b.throughput:,.0f} out tok/s)"
    elif len(a.knobs) < len(b.knobs):
        head = (f"same run time ({a.run_s:.1f} s) with {len(a.knobs)} vs {len(b.knobs)} changed knobs (a change must buy "
                f"run time; total {a.total_s:.0f} vs {b.total_s:.0f} s)")
    else:
        head = f"same run time; total {a.total_s:.1f} vs {b.total_s:.1f} s"
    if a.label != b.label:
        ma, mb = _decoding_model(a), _decoding_model(b)
        return (f"{head}: layout {a.label} vs {b.label} (KV {_kv_tokens(a):,} vs {_kv_tokens(b):,} tokens, "
                f"weights {ma.weights_bytes_per_gpu() / 1e9:.0f} vs {mb.weights_bytes_per_gpu() / 1e9:.0f} GB/GPU)")
    names = [n for n in dict.fromkeys([*a.knobs, *b.knobs]) if a.knobs.get(n) != b.knobs.get(n)]
    if not names:
        return head
    return f"{head}: " + "; ".join(_mechanism(n, a, b) for n in names[:2])


# ------------------------------------------------------------------------------------------- output


def ranking_table(candidates: Sequence[Candidate], gpu: str, limit: int | None = None) -> str:
    """One row per candidate: layout + knobs, memory, simulated throughput, times, deadline, why it beats the next."""
    rows = [
        f"{'#':>3} {'layout + knobs':<58} {'memory':<20} {'out tok/s':>9} {'run s':>6} {'TTFT p50 s':>10} "
        f"{'start s':>7} {'total s':>7}  deadline  ({LABEL}, {gpu})"
    ]
    shown = list(candidates)[:limit] if limit else list(candidates)
    for rank, c in enumerate(shown, 1):
        name = c.name if len(c.name) <= 58 else c.name[:55] + "..."
        if c.budget is None:
            worst = max(c.memory.groups, key=lambda g: g.weights_gb)
            rows.append(f"{rank:>3} {name:<58} {c.memory.verdict:<20} (weights {worst.weights_gb:.0f} GB/GPU)")
            continue
        run = c.budget.run
        rows.append(
            f"{rank:>3} {name:<58} {c.memory.verdict:<20} {run.output_throughput:>9,.0f} {run.duration_s:>6.1f} "
            f"{run.ttft_p(50):>10.2f} {c.budget.startup_s:>7.1f} {c.budget.total_s:>7.1f}  {c.budget.verdict}"
        )
        if c.equivalents:
            rows.append(f"{'':>4}same prediction with: {', '.join(c.equivalents[:4])}"
                        + (f" (+{len(c.equivalents) - 4})" if len(c.equivalents) > 4 else ""))
        if c.why:
            rows.append(f"{'':>4}beats #{rank + 1}: {c.why}")
    if limit and len(candidates) > limit:
        rows.append(f"... {len(candidates) - limit} more")
    return "\n".join(rows)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def write_top_configs(
    cfg: RunConfig, candidates: Sequence[Candidate], top: int, write_dir: str | Path, gpu: str
) -> list[Path]:
    """Write the best `top` fitting, compliant candidates as RunConfig YAML files; return their paths."""
    out_dir = Path(write_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    chosen = [c for c in candidates if c.writable and c.budget.verdict != INVALID][:top]
    for rank, c in enumerate(chosen, 1):
        name = f"{cfg.name}-plan{rank}-{_slug(c.name)}"[:120]
        full = c.config.model_dump(mode="json")
        data = c.config.model_dump(mode="json", exclude_defaults=True)
        data["name"] = name
        if c.rules is not None:
            data["rules"] = c.rules.profile
        # spelled out even where they equal a default: what the prediction assumed
        for section, keys in (("cluster", ("gpu", "gpus_per_node", "num_nodes")), ("model", ("preset", "quantization")),
                              ("benchmark", ("num_prompts", "seed", "deadline_s"))):
            data[section] = {**{k: full[section][k] for k in keys}, **data.get(section, {})}
        data.setdefault("engine", {}).setdefault("sglang", {})["load_format"] = full["engine"]["sglang"]["load_format"]
        data["layout"] = c.layout  # keep the layout literal even where it equals a default
        data = {k: data[k] for k in RunConfig.model_fields if k in data}  # the schema's section order
        config_from_dict(data, name)  # what we write must load
        compliance = "" if c.rules is None else f"; rules {c.rules.profile}: {c.rules.verdict}"
        still = [] if c.rules is None else [f"# rules {c.rules.profile} still needs: {v.line()}\n" for v in c.rules.violations]
        header = (
            f"# Written by `pd-orchestrator plan --search`, rank {rank} on {gpu} ({LABEL}): {c.name}: "
            f"{c.budget.run.output_throughput:,.0f} output tok/s, run {c.budget.run.duration_s:.0f} s, "
            f"total {c.budget.total_s:.0f} s of {c.budget.deadline_s:.0f} s -> {c.budget.verdict}; "
            f"memory {c.memory.verdict}{compliance}.\n"
        )
        if c.why:
            header += f"# Beats the next layout in the ranking: {c.why}\n"
        header += "".join(still)
        path = out_dir / f"{name}.yaml"
        path.write_text(header + yaml.safe_dump(data, sort_keys=False))
        written.append(path)
    return written


# ---------------------------------------------------------------------------------------------- CLI


def add_search_args(parser) -> None:
    """`plan`'s search options besides --search/--top/--write-dir: rules, how many layouts to tune, rows shown."""
    parser.add_argument(
        "--rules", help="competition rules profile (name or YAML path; default: the config's `rules`), e.g. "
        "apac-hpcai-2025: plan states the verdict; --search proposes only compliant layouts",
    )
    parser.add_argument("--tune-top", type=int, default=4, help="how many of the best layouts get their knobs tuned")
    parser.add_argument("--show", type=int, default=25, help="rows of the search ranking to print (0 = all)")


def print_search(
    cfg: RunConfig, batch: Sequence[tuple[int, int]], gpu: str, *, rules: str | None = None, top: int = 3,
    write_dir: str | None = None, tune_top: int = 4, show: int = 25, disk_gb_s: float = 2.0, jit_cached: bool = True,
) -> bool:
    """Run the search and print it as `plan --search` does; True when some layout fits inside the deadline."""
    import time

    from orchestrator.rules import load_profile

    name = rules or cfg.rules
    profile = load_profile(name) if name else None
    started = time.monotonic()
    found = search(cfg, batch, gpu=gpu, disk_gb_s=disk_gb_s, jit_cached=jit_cached, rules=profile, tune_top=tune_top)
    cluster = f"{cfg.cluster.num_nodes}x{cfg.cluster.gpus_per_node} {gpu}"
    scope = f", rules {found.rules}: only compliant configs" if found.rules else ""
    print(
        f"search on {cluster}{scope}: {found.layouts} layouts, {found.evaluated} configs evaluated "
        f"({found.pruned_memory} pruned by memory before simulation, {found.not_compliant} not compliant), knobs "
        f"tuned on the best {tune_top}; ranked: inside the deadline, then run time (= output tok/s on this batch), "
        f"then fewest changes, then total time; {time.monotonic() - started:.1f} s of CPU"
    )
    for note in found.notes:
        print(f"  rules {found.rules} sets {note}")
    for v in found.standing:
        print(f"  rules {found.rules}: every layout still needs (the search cannot change it): {v.line()}")
    print(ranking_table(found.ranked, gpu, limit=show or None))
    if not found.proposals:
        print("no layout fits inside the deadline" + (f" under rules {found.rules}" if found.rules else ""))
    if write_dir:
        paths = write_top_configs(cfg, found.ranked, top, write_dir, gpu)
        print("\nwrote: " + (", ".join(str(p) for p in paths) or "nothing (no layout fits)"))
    return bool(found.proposals)
