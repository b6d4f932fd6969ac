"""Does one worker group's server fit its GPUs, and does its KV hold the batch (server_memory: weights, static pool,
KV tokens, the batch's concurrent KV need, activation headroom -> GroupMemory with its verdict and the fix)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrator.config import RunConfig, WorkerGroup
from orchestrator.config.server_spec import ServerSpec, server_spec
from orchestrator.perfmodel.costmodel import EngineCostModel, cost_model_of_spec
from orchestrator.perfmodel.gpus import GB
from orchestrator.perfmodel.server.activations import ACTIVATION_HEADROOM
from orchestrator.plan.memory.report import (
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_TOKENS_PER_REQUEST,
    DOES_NOT_FIT,
    FITS,
    LITTLE_KV,
    LITTLE_KV_SHARE,
    GroupMemory,
)
from orchestrator.records import Role


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


def kv_needed(
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


def decode_batch(role: Role, concurrency: int, kv_tokens: int, batch: Sequence[tuple[int, int]] | None) -> int:
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
    concurrency, needed = kv_needed(cfg, role, model, batch)
    running = decode_batch(role, concurrency, kv_tokens, batch)
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
