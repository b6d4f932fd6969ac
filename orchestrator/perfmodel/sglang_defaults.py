"""SGLang's own defaults for the flags that decided the real runs, as SGLang derives them.

(version, GPU memory, TP/PP, role, flags given) -> chunked_prefill_size, decode CUDA-graph batch sizes
(and their max), mem_fraction_static, max_running_requests. Two SGLang generations are modelled, read
from their source (server_args.py, cuda_graph_runner.py, model_runner.py / kv_cache_configurator.py,
tp_worker.py):

- 0.4.x (0.4.10: the published 2 x 8 H100 runs): the decode graph list is [1, 2, 4, 8] + 16..160 step 8
  (+ 168..256 on GPUs above 90 GiB); --cuda-graph-max-bs above the list adds max..bs step 16. Default
  mem_fraction_static = (mem - reserved) / mem with reserved = (9.5 + tp*pp/2) GiB below 90 GiB,
  (12 + tp*pp/2) GiB below 160 GiB, + 4 GiB with DP attention. max_running_requests =
  min(max_total_tokens // 2 or the flag (per DP-attention rank), req pool), req pool =
  clamp(max_total_tokens / context_len * 512, 2048, 4096) (or the flag when given).
- 0.5.x (0.5.17: our runs): graph max bs 256 (tp < 4) or 512 (tp >= 4) on 60-160 GiB GPUs; list
  [1, 2, 4, 8, 12] + 16..256 step 8 + 272..496 step 16 + 512..max step 32, + max itself. Default
  mem_fraction_static = (mem - reserved) / mem, reserved (MiB) = max(512 + 1.5 x activation tokens
  (chunked prefill, or the running batch on a PD decode, >= 2048) + tp*pp/8 GiB + 2 x decode graph max bs
  + DP-attention padding + 8 MiB per prefill graph size, 10 GiB on GPUs above 60 GiB) (server_args.py
  _handle_gpu_memory_settings and reserve_for_graph_mb). The prefill term counts only graphs SGLang will
  capture: its 1.5 GiB MLA branch is never reached by default, because _handle_cuda_graph_config turns the MLA
  prefill graph off before _handle_gpu_memory_settings runs (prefill_graphs_captured).
  max_running_requests = min(clamp(tokens / context_len * 512, 2048, 4096) or the flag / attn DP,
  tokens // 2).

A decode step whose batch is larger than the largest captured graph runs eagerly (cuda graph: False in
SGLang's decode log); its cost is the calibration profile's business (perfmodel/calibration.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.config.sglang_versions import version_tuple

MIB_PER_GIB = 1024
TRITON_NUM_KV_SPLITS = 8  # --triton-attention-num-kv-splits (0.4.x and 0.5.17)


def _new(version: str) -> bool:
    return version_tuple(version) >= (0, 5, 0)


def prefill_graphs_captured(version: str, mla: bool) -> bool:
    """Whether SGLang captures prefill CUDA graphs when --disable-prefill-cuda-graph is not given. 0.5.x defaults the
    prefill phase to its breakable CUDA graph and turns it off for MLA attention outside DSA (server_args.py,
    _disable_breakable_cudagraph_if_incompatible: "Breakable CUDA graph is incompatible with MLA attention (non-DSA);
    disabling prefill CUDA graph", in the log of every R1-shaped and V2-Lite server we ran); 0.4.x captures none.
    Without them a prefill forward is launched kernel by kernel (perfmodel/server/prefill.py prefill_time_s)."""
    return _new(version) and not mla


def prefill_graph_batch_sizes(max_tokens: int) -> list[int]:
    """The prefill (breakable) CUDA-graph token sizes SGLang 0.5.x captures up to `max_tokens`
    (server_args.py _generate_prefill_cuda_graph_batch_sizes)."""
    sizes = (
        list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512))
    )
    return [s for s in sizes if s <= max_tokens]


def chunked_prefill_default(version: str, gpu_mem_mib: float) -> int:
    """--chunked-prefill-size when unset: 2k below 35 GiB, 4k below 60 GiB (0.5.x), 8k below 160 GiB, else 16k."""
    gib = gpu_mem_mib / MIB_PER_GIB
    if gib < 35:
        return 2048
    if _new(version) and gib < 60:
        return 4096
    if gib < 160:
        return 8192
    return 16384


def cuda_graph_max_bs_default(version: str, gpu_mem_mib: float, tp: int) -> int:
    """The largest decode batch SGLang captures a CUDA graph for, when --cuda-graph-max-bs is unset."""
    gib = gpu_mem_mib / MIB_PER_GIB
    if not _new(version):
        if gib < 35:
            return 8 if tp < 4 else 80
        return 256 if gib > 90 else 160
    if gib < 20:
        return 8
    if gib < 35:
        return 24 if tp < 4 else 80
    if gib < 60:
        return 32 if tp < 4 else 160
    if gib < 160:
        return 256 if tp < 4 else 512
    return 512


def cuda_graph_batch_sizes(
    version: str, gpu_mem_mib: float, tp: int, max_bs: int | None = None, req_pool: int | None = None
) -> list[int]:
    """Decode batch sizes SGLang captures (no speculative decoding, padding on)."""
    if not _new(version):
        sizes = [1, 2, 4, 8] + list(range(16, 161, 8))
        if gpu_mem_mib > 90 * MIB_PER_GIB:
            sizes += list(range(160, 257, 8))
        if req_pool is not None and max(sizes) > req_pool:
            sizes.append(req_pool)
        if max_bs:
            sizes = [b for b in sizes if b <= max_bs]
            if max(sizes) < max_bs:
                sizes += list(range(max(sizes), max_bs + 1, 16))
        if req_pool is not None:
            sizes = [b for b in sizes if b <= req_pool]
        return sorted(set(sizes))
    top = max_bs or cuda_graph_max_bs_default(version, gpu_mem_mib, tp)
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, top + 1, 32))
    sizes = [b for b in sizes if b <= top]
    if top not in sizes:
        sizes.append(top)
    if req_pool is not None and max(sizes) > req_pool:
        # cuda_graph_runner.get_batch_sizes_to_capture: sizes above the request pool (--max-running-requests) are
        # never captured, the pool size itself is
        sizes = sorted({b for b in sizes if b <= req_pool} | {req_pool})
    return sizes


@dataclass(frozen=True)
class MemFractionInputs:
    gpu_mem_mib: float
    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_attention: bool = False
    role: str = "aggregated"  # aggregated | prefill | decode
    chunked_prefill_size: int = 8192
    graph_max_bs: int = 256
    decode_graphs: bool = True
    prefill_graphs: bool = True
    max_running_requests: int | None = None
    speculative: bool = False
    mla: bool = True
    max_total_tokens: int | None = None  # --max-total-tokens: caps the prefill graphs' largest size


def mem_fraction_static_default(version: str, x: MemFractionInputs) -> float:
    """SGLang's mem_fraction_static when the flag is unset (rounded to 3 decimals, as SGLang does)."""
    mem = x.gpu_mem_mib
    gib = mem / MIB_PER_GIB
    parallel = x.tp * x.pp
    if not _new(version):
        if gib < 35:
            reserved = (2.8 + parallel / 10) * MIB_PER_GIB
        elif gib < 90:
            reserved = (9.5 + parallel / 2) * MIB_PER_GIB
        elif gib < 160:
            reserved = (12 + parallel / 2) * MIB_PER_GIB
        else:
            reserved = 32 * MIB_PER_GIB
        reserved += 2 * MIB_PER_GIB if x.speculative else 0
        reserved += 4 * MIB_PER_GIB if x.dp_attention else 0
        return round((mem - reserved) / mem, 3)
    if x.role == "decode":
        activation_tokens = max(x.max_running_requests or x.graph_max_bs or 1, 2048)
    else:
        activation_tokens = max(x.chunked_prefill_size, 2048)
    reserved = 512 + activation_tokens * 1.5 + parallel / 8 * MIB_PER_GIB
    if x.role != "prefill" and x.decode_graphs:
        reserved += x.graph_max_bs * 2
    if x.dp_attention and x.role != "prefill":
        reserved += x.graph_max_bs * x.dp * 3 + (x.graph_max_bs * x.dp * 1.5 if x.graph_max_bs > 300 else 0)
    if x.role != "decode" and x.prefill_graphs and prefill_graphs_captured(version, x.mla):
        # prefill graphs to the chunk size (capped by --max-total-tokens), 8 MiB each; an MLA model never gets here
        # (its graph is off before the reserve is computed), so SGLang's 1.5 GiB MLA branch is not charged
        top = x.chunked_prefill_size if x.max_total_tokens is None else min(x.chunked_prefill_size, x.max_total_tokens)
        reserved += len(prefill_graph_batch_sizes(top)) * 8
    if gib > 60:
        reserved = max(reserved, 10 * MIB_PER_GIB)
    return round((mem - reserved) / mem, 3)


def max_running_requests(
    version: str, kv_tokens: int, context_len: int, requested: int | None = None, attn_dp: int = 1
) -> int:
    """Requests one scheduler (one DP-attention rank) runs at most, as SGLang derives it from its KV pool."""
    if kv_tokens <= 0:
        return 0
    pool = min(max(int(kv_tokens / max(1, context_len) * 512), 2048), 4096)
    if not _new(version):
        if requested is not None:
            return max(1, requested // attn_dp)  # the req pool is sized to the flag; no token clamp in 0.4.x
        return max(1, min(kv_tokens // 2, pool))
    if requested is not None:
        return max(1, min(requested // attn_dp, kv_tokens // 2))
    return max(1, min(pool, kv_tokens // 2))


def graph_covers(batch_size: int, sizes: list[int]) -> bool:
    """A decode batch runs a captured graph (padded up to the next size) iff it is <= the largest size."""
    return bool(sizes) and batch_size <= max(sizes)


def padded_batch(batch_size: int, sizes: list[int]) -> int:
    """The captured size a graph-covered batch is padded to (SGLang pads up to the next captured size)."""
    for s in sorted(sizes):
        if s >= batch_size:
            return s
    return batch_size


def ceil_pages(tokens: int, page_size: int) -> int:
    return int(math.ceil(tokens / page_size) * page_size) if page_size > 1 else tokens
