"""Memory preflight: does each worker group's server fit its GPUs, and does its KV hold the batch?

config -> per group: weights/GPU (by weight class), activation + CUDA-graph reserve, KV tokens left,
KV the batch's concurrency needs -> verdict fits | fits-with-little-KV | does-not-fit -> MemoryReport,
with the nearest layouts that fit when one does not. `bench` calls `require_fit` before any bring-up.

Assumptions are the cost model's (orchestrator/perfmodel/server/memory.py): SGLang's static pool is
mem_fraction_static x the memory free at weight load and holds weights + KV (with PP the heaviest stage's weights
set every stage's budget); the rest is the activation/CUDA-graph reserve.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import permutations

from orchestrator.config import RunConfig, WorkerGroup, config_from_dict
from orchestrator.config.server_spec import ServerSpec, server_spec
from orchestrator.config.sglang_versions import release_for
from orchestrator.perfmodel.costmodel import EngineCostModel, cost_model_of_spec
from orchestrator.perfmodel.gpus import GB
from orchestrator.perfmodel.server.activations import ACTIVATION_HEADROOM
from orchestrator.records import Role

FITS = "fits"
LITTLE_KV = "fits-with-little-KV"
DOES_NOT_FIT = "does-not-fit"
_SEVERITY = {FITS: 0, LITTLE_KV: 1, DOES_NOT_FIT: 2}

# When no batch is given: ShareGPT's mean prompt + output (SGLang's sampling, R1 tokenizer, seed 2025:
# 306 + 203 tokens per request over 1000 prompts).
DEFAULT_TOKENS_PER_REQUEST = 508
DEFAULT_PROMPT_TOKENS = 306
# Below this share of the batch's concurrent KV need, queueing dominates the run: "little KV".
LITTLE_KV_SHARE = 0.5


@dataclass
class GroupMemory:
    """One worker group's memory numbers per GPU (GB = 1e9 bytes) and its verdict."""

    role: Role
    index: int
    layout: str  # e.g. "1 x TP8"
    gpu: str
    gpu_memory_gb: float
    weights_gb: float
    weights_breakdown_gb: dict[str, float]
    static_pool_gb: float
    reserve_gb: float
    kv_gb: float
    kv_capacity_tokens: int
    kv_needed_tokens: int
    concurrency: int
    verdict: str
    reason: str

    @property
    def where(self) -> str:
        return f"layout.{self.role}.{self.index}"


@dataclass
class MemoryReport:
    """Per-group verdicts; `verdict` is the worst of them; `options` are nearby layouts that fit."""

    model: str
    quantization: str
    groups: list[GroupMemory]
    options: list[str] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)  # one line per GPU that several servers share

    @property
    def verdict(self) -> str:
        return max((g.verdict for g in self.groups), key=_SEVERITY.__getitem__)

    @property
    def fits(self) -> bool:
        """False only when some group does not fit at all (little KV still runs, slowly)."""
        return self.verdict != DOES_NOT_FIT

    def table(self) -> str:
        head = (
            f"{'group':<20} {'servers':<10} {'GPU':<9} {'mem GB':>7} {'weights':>8} {'reserve':>8} "
            f"{'KV GB':>7} {'KV tokens':>10} {'needed':>9}  verdict"
        )
        rows = [head]
        for g in self.groups:
            rows.append(
                f"{g.where:<20} {g.layout:<10} {g.gpu:<9} {g.gpu_memory_gb:>7.1f} {g.weights_gb:>8.1f} "
                f"{g.reserve_gb:>8.1f} {g.kv_gb:>7.1f} {g.kv_capacity_tokens:>10,} {g.kv_needed_tokens:>9,}  "
                f"{g.verdict}"
            )
        return "\n".join(rows + self.shared)

    def summary(self) -> str:
        """The verdict with every reason, and the options when something does not fit."""
        lines = [f"memory: {self.verdict} ({self.model} {self.quantization.upper()})"]
        lines += [f"  {g.where}: {g.reason}" for g in self.groups if g.verdict != FITS]
        if self.options:
            lines.append("  layouts that fit: " + "; ".join(self.options))
        return "\n".join(lines)


class LayoutDoesNotFit(RuntimeError):
    """Raised by `require_fit`: the message is the report's summary, naming each group and the fix."""

    def __init__(self, report: MemoryReport):
        self.report = report
        super().__init__(report.summary() + "\n  (pass --force to launch anyway)")


def _layout_label(count: int, spec: ServerSpec) -> str:
    p = spec.parallel
    text = f"{count} x TP{p.tp}"
    if p.dp > 1:
        text += f"DP{p.dp}" + ("a" if p.dp_attention else "")
    if p.pp > 1:
        text += f"PP{p.pp}"
    return text


def _servers_by_role(cfg: RunConfig, role: Role) -> int:
    return sum(g.count for r, _, g in cfg.layout.groups() if r == role)


def _kv_needed(
    cfg: RunConfig, role: Role, model: EngineCostModel, batch: Sequence[tuple[int, int]] | None
) -> tuple[int, int]:
    """(concurrent requests per server, KV tokens they need) when the whole batch is sent at once."""
    num = len(batch) if batch else cfg.benchmark.num_prompts
    per_request = (sum(p + o for p, o in batch) / len(batch)) if batch else DEFAULT_TOKENS_PER_REQUEST
    servers = max(1, _servers_by_role(cfg, role))
    concurrency = min(-(-num // servers), model.max_running())
    if role == "prefill":
        # a PD prefill holds a prompt's KV only until it is sent: about two chunks in flight
        longest = max((p for p, _ in batch), default=0) if batch else 0
        return concurrency, 2 * max(model.prefill_chunk_tokens(), longest)
    return concurrency, int(concurrency * per_request)


def _decode_batch(role: Role, concurrency: int, kv_tokens: int, batch: Sequence[tuple[int, int]] | None) -> int:
    """The largest decode batch the server can reach: its concurrency, but never more requests than the KV pool holds
    prompts of (0 on a PD prefill, which runs no decode steps)."""
    if role == "prefill":
        return 0
    prompt = (sum(p for p, _ in batch) / len(batch)) if batch else DEFAULT_PROMPT_TOKENS
    return min(concurrency, int(kv_tokens // max(1.0, prompt)))


def group_memory(
    cfg: RunConfig,
    role: Role,
    index: int,
    group: WorkerGroup,
    batch: Sequence[tuple[int, int]] | None = None,
    gpu: str | None = None,
    spec: ServerSpec | None = None,
) -> GroupMemory:
    """Memory numbers and verdict of one group on `gpu` (default: cluster.gpu, the target hardware): the memory of
    the server its ServerSpec describes (`spec`, default server_spec(cfg, role, group)), no setting re-read."""
    return server_memory(cfg, spec or server_spec(cfg, role, group), index, group.count, batch, gpu)


def server_memory(
    cfg: RunConfig,
    spec: ServerSpec,
    index: int,
    count: int = 1,
    batch: Sequence[tuple[int, int]] | None = None,
    gpu: str | None = None,
) -> GroupMemory:
    """Memory numbers and verdict of `count` servers of one ServerSpec (parallelism, memory fraction, KV dtype,
    batching: all from the spec) on `gpu` (default: cluster.gpu)."""
    role = spec.role
    model = cost_model_of_spec(cfg, spec, gpu=gpu or cfg.cluster.gpu)
    weights = model.weights_bytes_per_gpu()
    pool = model.static_pool_bytes()
    kv_tokens = model.kv_capacity_tokens()
    concurrency, needed = _kv_needed(cfg, role, model, batch)
    running = _decode_batch(role, concurrency, kv_tokens, batch)
    longest = max((p + o for p, o in batch), default=0) if batch else 0
    name = f"{cfg.model.quantization.upper()} {model.arch.name} TP{model.tp}" + (
        f"xPP{model.pp}" if model.pp > 1 else ""
    )
    if weights >= pool or kv_tokens < max(longest, model.prefill_chunk_tokens()):
        verdict = DOES_NOT_FIT
        reason = (
            f"{name} needs {weights / GB:.1f} GB/GPU for weights alone; {model.gpu.name}'s static pool is "
            f"{model.mem_fraction_static:.2f} x {model.free_at_load_bytes() / GB:.1f} GB free at weight load = {pool / GB:.1f} GB"
            + (f", leaving KV for only {kv_tokens:,} tokens" if weights < pool else "")
        )
    elif not model.activation_headroom_ok(running):
        verdict = DOES_NOT_FIT
        reason = _headroom_reason(model, running, f"layout.{role}.{index}")
    elif kv_tokens < LITTLE_KV_SHARE * needed:
        verdict = LITTLE_KV
        reason = (
            f"KV holds {kv_tokens:,} tokens but {concurrency} concurrent requests need ~{needed:,}; "
            f"most requests will queue (add servers, GPUs with more memory, or a 4-bit checkpoint)"
        )
    else:
        verdict = FITS
        held = min(1.0, kv_tokens / needed) if needed else 1.0
        reason = f"{weights / GB:.1f} GB/GPU weights, KV for {kv_tokens:,} tokens ({held:.0%} of the batch's concurrency)"
    return GroupMemory(
        role=role,
        index=index,
        layout=_layout_label(count, spec),
        gpu=model.gpu.name,
        gpu_memory_gb=model.gpu.memory_bytes / GB,
        weights_gb=weights / GB,
        weights_breakdown_gb={k: v / GB for k, v in model.weight_bytes_breakdown().items()},
        static_pool_gb=pool / GB,
        reserve_gb=model.reserve_bytes() / GB,
        kv_gb=model.kv_pool_bytes_per_gpu() / GB,
        kv_capacity_tokens=kv_tokens,
        kv_needed_tokens=needed,
        concurrency=concurrency,
        verdict=verdict,
        reason=reason,
    )


def _headroom_reason(model: EngineCostModel, running: int, where: str) -> str:
    """Why the reserve cannot hold the largest forward, and the settings that would (naming the group's fields)."""
    peak = model.activation_peak_bytes(running)
    # free after start = memory - fraction x free at load - held before load - start-up overhead >= margin x peak
    top = (model.gpu.memory_bytes - model.held_before_load_bytes() - model.runtime_overhead_bytes()
           - ACTIVATION_HEADROOM * peak) / model.free_at_load_bytes()
    fixes = [f"set {where}.mem_fraction_static <= {math.floor(top * 100) / 100:.2f}"]  # rounded down: it must pass
    batch = model.decode_batch_per_rank(running)
    if model.eager_decode_bytes(batch) >= peak:
        micro = model.decode_micro_batch(batch)
        step = f"{micro} requests" if micro == batch else f"a {micro}-request micro-batch (PP{model.pp})"
        held = ("the triton backend's attn_logits for it and for the step before, and the two steps' fp32 logits"
                if model.attention_backend == "triton" else "its fp32 logits and the step before's")
        what = f"an eager decode step of {step} past the largest CUDA graph ({model.captured_graph_max_bs}): {held}"
        # SGLang admits max_running_requests // pp requests into each micro-batch
        fixes.append(f"{where}.max_running_requests <= {model.graph_max_bs * model.pp} (every decode step replays a graph)")
    else:
        what = f"a prefill chunk of {model.prefill_chunk_tokens()} tokens"
        fixes.append(f"a smaller {where}.chunked_prefill_size")
    return (
        f"activation headroom: mem_fraction_static {model.mem_fraction_static:.2f} leaves "
        f"{model.free_after_start_bytes() / GB:.1f} GB/GPU after start (graphs, context) for {what}, ~{peak / GB:.1f} GB "
        f"(x{ACTIVATION_HEADROOM:g} margin): CUDA OOM under load; " + " or ".join(fixes)
    )


def _graph_max_bs_text(model: EngineCostModel) -> str | None:
    """The decode graph max SGLang resolves, and where its request pool stops the capture below it."""
    if model.graph_max_bs == 0:
        return None
    if model.captured_graph_max_bs < model.graph_max_bs:
        return f"{model.graph_max_bs} (captured to {model.captured_graph_max_bs}: the request pool, max_running_requests)"
    return str(model.graph_max_bs)


def sglang_defaults_text(cfg: RunConfig, gpu: str | None = None) -> str:
    """What each group's servers take from SGLang's own defaults: the flags its ServerSpec leaves unset, valued as
    engine.sglang.version derives them on `gpu` (the table of config/sglang_versions.py, perfmodel/sglang_defaults)."""
    version = cfg.engine.sglang.version
    release = release_for(version)
    table = "" if release.version == version else f", the {release.version} table"
    lines = [f"SGLang {version} defaults (engine.sglang.version{table}) for the flags left unset:"]
    for role, i, group in cfg.layout.groups():
        spec = server_spec(cfg, role, group)
        model = cost_model_of_spec(cfg, spec, gpu=gpu or cfg.cluster.gpu)
        unset = {
            "chunked_prefill_size": (spec.batching.chunked_prefill_size, model.chunked_prefill_tokens),
            "mem_fraction_static": (spec.memory.mem_fraction_static, model.mem_fraction_static),
            "cuda_graph_max_bs": (spec.batching.cuda_graph_max_bs, _graph_max_bs_text(model)),
            "max_running_requests": (spec.batching.max_running_requests, model.max_running()),
        }
        shown = [f"{name} {value}" for name, (given, value) in unset.items() if given is None and value is not None]
        lines.append(f"  layout.{role}.{i}: " + (", ".join(shown) or "every such flag is set"))
    lines.append(f"  ({release.version}: {release.defaults_note})")
    return "\n".join(lines)


def check_layout_fits(
    cfg: RunConfig,
    batch: Sequence[tuple[int, int]] | None = None,
    gpu: str | None = None,
    suggest: bool = True,
) -> MemoryReport:
    """Memory preflight of every group on the target GPUs; when something does not fit, list options."""
    report = MemoryReport(
        model=cfg.model.architecture().name,
        quantization=cfg.model.quantization,
        groups=[group_memory(cfg, role, i, g, batch, gpu) for role, i, g in cfg.layout.groups()],
    )
    judged: set[str] = set()
    for residents in gpu_sharing(cfg):
        report.shared.append(_judge_shared_gpu(cfg, residents, report.groups, judged, batch, gpu))
    if suggest and not report.fits:
        report.options = nearest_fitting_layouts(cfg, gpu)
    return report


def require_fit(cfg: RunConfig, force: bool = False, batch: Sequence[tuple[int, int]] | None = None) -> MemoryReport:
    """The preflight `bench` runs: raise LayoutDoesNotFit unless it fits or `force` is set."""
    report = check_layout_fits(cfg, batch)
    if not report.fits and not force:
        raise LayoutDoesNotFit(report)
    return report


# ----- servers sharing one GPU ---------------------------------------------------------------------------------
def gpu_sharing(cfg: RunConfig) -> list[list[tuple[Role, int]]]:
    """The (role, group index) of every server on each GPU that several share. On a local cluster with
    gpu_split: off every raylet sees the machine's GPUs and Ray numbers each raylet's from 0, so the k-th GPU the
    servers of one local node take is the k-th of the other node's too (a PD pair on one GPU)."""
    if not (cfg.cluster.is_local and cfg.cluster.local.gpu_split == "off"):
        return []
    taken: dict[str, int] = defaultdict(int)
    on_gpu: dict[int, list[tuple[Role, int]]] = defaultdict(list)
    for role, i, group in cfg.layout.groups():
        node = cfg.node_role(role, group)
        per_server = -(-group.gpus_per_server // group.nnodes)
        for _ in range(group.count):
            for k in range(taken[node], taken[node] + per_server):
                on_gpu[k].append((role, i))
            taken[node] += per_server
    return [servers for servers in on_gpu.values() if len(servers) > 1]


def _judge_shared_gpu(cfg: RunConfig, residents: list[tuple[Role, int]], groups: list[GroupMemory], judged: set[str],
                      batch: Sequence[tuple[int, int]] | None, gpu: str | None) -> str:
    """Judge the servers of one shared GPU together (their verdicts replace the one-GPU-each view; a group on several
    shared GPUs keeps its worst) and return the table's line for that GPU.

    SGLang 0.5.17 (mem_cache/kv_cache_configurator.py, _profile_available_bytes) sizes a server's KV pool as the
    memory free when it profiles less (1 - mem_fraction_static) x the memory free before its weights loaded
    (distributed/bootstrap.py: pre_model_load_memory, read once its CUDA context is up), capped by --max-total-tokens.
    The servers start together, so before the weights every process's context is held (memory - the residents'
    held_before_load: the fraction's base) and at the profile every weight is loaded, and a server that profiles after
    the others finds their pools taken: each start order is tried and each server keeps its smallest pool (a server
    that starts after another's weights gets a larger pool: (1 - fraction) of their footprint is not reserved twice)."""
    models = [cost_model_of_spec(cfg, server_spec(cfg, role, getattr(cfg.layout, role)[i]), gpu=gpu or cfg.cluster.gpu)
              for role, i in residents]
    memory = models[0].gpu.memory_bytes
    held = sum(m.held_before_load_bytes() for m in models)  # every process's CUDA context (and NCCL) before weights
    weights = sum(m.weights_bytes_per_gpu() for m in models)
    overheads = sum(m.runtime_overhead_bytes() for m in models)
    worst = [float("inf")] * len(models)
    used_pools = 0.0
    for order in permutations(range(len(models))):
        pools, earlier = [0.0] * len(models), 0.0
        for k in order:
            budget = (models[k].mem_fraction_static or 0.0) * (memory - held) - weights - earlier
            pools[k] = models[k].kv_pool_bytes_per_gpu(budget)
            worst[k] = min(worst[k], budget if budget <= 0 else pools[k])
            earlier += pools[k] + models[k].runtime_overhead_bytes()
        used_pools = max(used_pools, sum(pools))
    # the forwards' room keeps the one-process accounting (start-up overheads, not the contexts again): the config that
    # ran 1000 prompts (configs/device-h100x1-1p1d.yaml; its servers' logs in sglang-router-call9.tar.xz) logged 9.99 GiB
    # free once both had started (the decode's last line), between this (11.3) and this less both held_before_load (8.3)
    free = memory - weights - used_pools - overheads
    names = [f"layout.{role}.{i}" for role, i in residents]
    verdicts: list[tuple[str, str, int, int]] = []  # verdict, reason, KV tokens, decode batch per server
    peaks = 0.0
    for name, model, pool in zip(names, models, worst):
        role: Role = model.role
        tokens = model.kv_tokens_in(pool)
        concurrency, needed = _kv_needed(cfg, role, model, batch)
        running = _decode_batch(role, concurrency, tokens, batch)
        peaks += model.activation_peak_bytes(running)
        longest = max((p + o for p, o in batch), default=0) if batch else 0
        if pool <= 0 or tokens < max(longest, model.prefill_chunk_tokens()):
            others = ", ".join(n for n in names if n != name)
            verdicts.append((DOES_NOT_FIT, (
                f"shares its GPU with {others} (cluster.local.gpu_split: off) and they start together: profiled after "
                f"them, SGLang leaves its KV pool {max(0.0, pool) / GB:.1f} GB ({tokens:,} tokens) at mem_fraction_static "
                f"{model.mem_fraction_static:.2f}; cap every pool with engine.sglang.max_total_tokens (or {name}.max_total_tokens) "
                f"so the first to start cannot take the others' share"), tokens, running))
        elif tokens < LITTLE_KV_SHARE * needed:
            verdicts.append((LITTLE_KV, f"KV holds {tokens:,} tokens (a GPU shared with {len(names) - 1} other server(s)) "
                             f"but {concurrency} concurrent requests need ~{needed:,}; most requests will queue", tokens, running))
        else:
            verdicts.append((FITS, f"KV for {tokens:,} tokens on a shared GPU", tokens, running))
    if free < ACTIVATION_HEADROOM * peaks:
        fixes = [f"{n}.max_running_requests <= {m.graph_max_bs}" for n, m, v in zip(names, models, verdicts)
                 if m.eager_decode_bytes(m.decode_batch_per_rank(v[3])) > 0]
        headroom = (f"activation headroom on the shared GPU: {free / GB:.1f} GB free after {len(names)} servers' weights, "
                    f"KV pools and start-up for forwards that can run at once, ~{peaks / GB:.1f} GB (x{ACTIVATION_HEADROOM:g}"
                    f" margin): CUDA OOM under load; lower the max_total_tokens caps" + "".join(f" or {f}" for f in fixes))
        verdicts = [(DOES_NOT_FIT, headroom, t, r) if v != DOES_NOT_FIT else (v, why, t, r) for v, why, t, r in verdicts]
    by_name = {g.where: g for g in groups}
    for name, model, pool, (verdict, reason, tokens, _) in zip(names, models, worst, verdicts):
        g = by_name[name]
        if g.weights_gb * GB >= model.static_pool_bytes():
            continue  # the weights alone do not fit: that verdict stands
        if name not in judged or _SEVERITY[verdict] > _SEVERITY[g.verdict]:
            g.verdict, g.reason, g.kv_capacity_tokens = verdict, reason, tokens
            g.kv_gb, g.reserve_gb = max(0.0, pool) / GB, (memory - weights - used_pools) / GB
        judged.add(name)
    return (f"  one GPU shared by {' + '.join(names)}: weights {weights / GB:.1f} + KV pools {used_pools / GB:.1f} + "
            f"start-up {overheads / GB:.1f} of {memory / GB:.1f} GB leave {free / GB:.1f} GB for forwards "
            f"(~{ACTIVATION_HEADROOM * peaks / GB:.1f} GB needed with the x{ACTIVATION_HEADROOM:g} margin)")


def _with(cfg: RunConfig, **changes: object) -> RunConfig | None:
    """A copy of cfg with changes applied (key 'a__b' sets data['a']['b']), or None if that is not valid."""
    data = cfg.model_dump(mode="json")
    for path, value in changes.items():
        node = data
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    try:
        return config_from_dict(data)
    except ValueError:
        return None


def nearest_fitting_layouts(cfg: RunConfig, gpu: str | None = None) -> list[str]:
    """One-change alternatives that fit: 4-bit checkpoint, H200 nodes, aggregated TP16 or TP8xPP2 over both nodes."""
    per_node = cfg.cluster.gpus_per_node
    quant = cfg.model.quantization
    # (label, changed config, GPU to check it on: the H200 option must not keep an explicit `gpu`)
    candidates: list[tuple[str, RunConfig | None, str | None]] = []
    if quant in ("bf16", "fp8"):
        candidates.append(("W4A8 checkpoint", _with(cfg, model__quantization="w4a8"), gpu))
    if (gpu or cfg.cluster.gpu) != "H200":
        candidates.append(("H200 nodes", _with(cfg, cluster__gpu="H200", cluster__gpu_memory_gb=None), None))
    if cfg.cluster.num_nodes >= 2:
        span = {"count": 1, "tp": per_node * 2, "nnodes": 2}
        pipe = {"count": 1, "tp": per_node, "nnodes": 2, "pp": 2}
        for label, group in ((f"aggregated TP{per_node * 2} over both nodes", span),
                             (f"aggregated TP{per_node}xPP2 over both nodes", pipe)):
            candidates.append((label, _with(cfg, layout={"mode": "aggregated", "aggregated": [group]}), gpu))
    found = []
    for label, option, option_gpu in candidates:
        if option is None:
            continue
        report = check_layout_fits(option, gpu=option_gpu, suggest=False)
        if report.fits:
            worst = max(report.groups, key=lambda g: g.weights_gb)
            found.append(f"{label} ({worst.weights_gb:.0f} GB/GPU weights, KV {worst.kv_capacity_tokens:,} tokens)")
    return found
