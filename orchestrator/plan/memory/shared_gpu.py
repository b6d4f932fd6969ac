"""Servers sharing one GPU (a local cluster with gpu_split: off), judged together: the KV pool each gets in every
start order, and the room left for forwards that can run at once."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from itertools import permutations

from orchestrator.config import RunConfig
from orchestrator.config.server_spec import server_spec
from orchestrator.perfmodel.costmodel import cost_model_of_spec
from orchestrator.perfmodel.gpus import GB
from orchestrator.perfmodel.server.activations import ACTIVATION_HEADROOM
from orchestrator.plan.memory.report import DOES_NOT_FIT, FITS, LITTLE_KV, LITTLE_KV_SHARE, SEVERITY, GroupMemory
from orchestrator.plan.memory.server_fit import decode_batch, kv_needed
from orchestrator.records import Role


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


def judge_shared_gpu(cfg: RunConfig, residents: list[tuple[Role, int]], groups: list[GroupMemory], judged: set[str],
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
        concurrency, needed = kv_needed(cfg, role, model, batch)
        running = decode_batch(role, concurrency, tokens, batch)
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
        if name not in judged or SEVERITY[verdict] > SEVERITY[g.verdict]:
            g.verdict, g.reason, g.kv_capacity_tokens = verdict, reason, tokens
            g.kv_gb, g.reserve_gb = max(0.0, pool) / GB, (memory - weights - used_pools) / GB
        judged.add(name)
    return (f"  one GPU shared by {' + '.join(names)}: weights {weights / GB:.1f} + KV pools {used_pools / GB:.1f} + "
            f"start-up {overheads / GB:.1f} of {memory / GB:.1f} GB leave {free / GB:.1f} GB for forwards "
            f"(~{ACTIVATION_HEADROOM * peaks / GB:.1f} GB needed with the x{ACTIVATION_HEADROOM:g} margin)")
