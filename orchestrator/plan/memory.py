"""Memory preflight: does each worker group's server fit its GPUs, and does its KV hold the batch?

config -> per group: weights/GPU (by weight class), activation + CUDA-graph reserve, KV tokens left,
KV the batch's concurrency needs -> verdict fits | fits-with-little-KV | does-not-fit -> MemoryReport,
with the nearest layouts that fit when one does not. `bench` calls `require_fit` before any bring-up.

Assumptions are the cost model's (orchestrator/sim/costmodel.py): SGLang's static pool is
mem_fraction_static x GPU memory and holds weights + KV; the rest is the activation/CUDA-graph reserve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.config import RunConfig, WorkerGroup, config_from_dict
from orchestrator.config.server_spec import ServerSpec, server_spec
from orchestrator.config.sglang_versions import release_for
from orchestrator.perfmodel.costmodel import ACTIVATION_HEADROOM, GB, EngineCostModel, cost_model_of_spec
from orchestrator.records import Role

FITS = "fits"
LITTLE_KV = "fits-with-little-KV"
DOES_NOT_FIT = "does-not-fit"
_SEVERITY = {FITS: 0, LITTLE_KV: 1, DOES_NOT_FIT: 2}

# When no batch is given: ShareGPT's mean prompt + output (SGLang's sampling, R1 tokenizer, seed 2025:
# 306 + 203 tokens per request over 1000 prompts).
DEFAULT_TOKENS_PER_REQUEST = 508
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
        return "\n".join(rows)

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
    running = concurrency if role != "prefill" else 0
    longest = max((p + o for p, o in batch), default=0) if batch else 0
    name = f"{cfg.model.quantization.upper()} {model.arch.name} TP{model.tp}" + (
        f"xPP{model.pp}" if model.pp > 1 else ""
    )
    if weights >= pool or kv_tokens < max(longest, model.prefill_chunk_tokens()):
        verdict = DOES_NOT_FIT
        reason = (
            f"{name} needs {weights / GB:.1f} GB/GPU for weights alone; {model.gpu.name}'s static pool is "
            f"{model.mem_fraction_static:.2f} x {model.gpu.memory_bytes / GB:.1f} GB = {pool / GB:.1f} GB"
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
    top = 1 - (model.runtime_overhead_bytes() + ACTIVATION_HEADROOM * peak) / model.gpu.memory_bytes
    fixes = [f"set {where}.mem_fraction_static <= {top:.2f}"]
    batch = model.decode_batch_per_rank(running)
    if model.eager_decode_bytes(batch) >= peak:
        what = (f"an eager decode step of {batch} requests past the largest CUDA graph ({model.graph_max_bs}): "
                f"the triton backend's attn_logits for it and for the step before")
        fixes.append(f"{where}.max_running_requests <= {model.graph_max_bs} (every decode step replays a graph)")
    else:
        what = f"a prefill chunk of {model.prefill_chunk_tokens()} tokens"
        fixes.append(f"a smaller {where}.chunked_prefill_size")
    return (
        f"activation headroom: mem_fraction_static {model.mem_fraction_static:.2f} leaves "
        f"{model.free_after_start_bytes() / GB:.1f} GB/GPU after start (graphs, context) for {what}, ~{peak / GB:.1f} GB "
        f"(x{ACTIVATION_HEADROOM:g} margin): CUDA OOM under load; " + " or ".join(fixes)
    )


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
            "cuda_graph_max_bs": (spec.batching.cuda_graph_max_bs, model.graph_max_bs if role != "prefill" else None),
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
    if suggest and not report.fits:
        report.options = nearest_fitting_layouts(cfg, gpu)
    return report


def require_fit(cfg: RunConfig, force: bool = False, batch: Sequence[tuple[int, int]] | None = None) -> MemoryReport:
    """The preflight `bench` runs: raise LayoutDoesNotFit unless it fits or `force` is set."""
    report = check_layout_fits(cfg, batch)
    if not report.fits and not force:
        raise LayoutDoesNotFit(report)
    return report


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
