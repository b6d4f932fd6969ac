"""Collective times on Hopper nodes from published NCCL measurements (nccl-tests), as latency + size / bus
bandwidth: an all-reduce of S bytes over n ranks takes alpha + 2 (n - 1) / n x S / busbw; an all-to-all
alpha + (n - 1) / n x S / busbw; a point-to-point send alpha + S / bw.

One GPU cannot measure these: every figure below cites where it was published. The two-GPU calibration
script (orchestrator/calibrate/twogpu.py) measures the intra-node ones on the lent machines when it runs.

GPUs without published figures here (the cpu-fast test profile) use their GpuSpec link fields instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.perfmodel.gpus import GB, GpuSpec


@dataclass(frozen=True)
class LinkFigures:
    """alpha (s) and bus bandwidth (B/s) of NCCL collectives inside one node and across two nodes."""

    intra_latency_s: float
    intra_allreduce_busbw: float
    intra_alltoall_busbw: float
    inter_latency_s: float
    inter_allreduce_busbw: float
    inter_alltoall_busbw: float  # per GPU: all-to-all cannot aggregate a node's NICs
    inter_p2p_bw: float  # one GPU's NIC
    # an all-reduce launched eagerly (a prefill forward, a decode step beyond the captured CUDA graphs) inside a node:
    # NCCL called from torch.distributed one call at a time, not replayed from a graph
    eager_intra_latency_s: float | None = None
    eager_intra_allreduce_busbw: float | None = None
    # CPU time one eager layer of a TP > 1 group costs beyond one GPU's launch of it (ForwardTerms.eager_launch_s): its
    # collectives' launches and whatever else TP adds to the launch path, as TP 2 - TP 1 on one host
    eager_tp_layer_s: float | None = None
    # GPU time one decoder layer of a TP group across two nodes costs beyond its all-reduces at the figures above
    inter_tp_layer_s: float | None = None


# Hopper HGX nodes (8 x H100 / H200 SXM, NVLink 4 through NVSwitch, 8 x ConnectX-7 NDR 400 Gb/s per node):
HOPPER = LinkFigures(
    # ~10.5 us for the smallest messages of nccl-tests inside an 8-GPU NVLink-4 node
    # (deepseek-ai/DeepEP issue 303, H20 node: NVLink 4 / NVSwitch like HGX H100)
    intra_latency_s=10.5e-6,
    # ring all-reduce busbw 365-370 GB/s on 8 x H100 SXM (NVIDIA/nccl issue 1455, NCCL_ALGO=RING; ~80 % of the
    # 450 GB/s line rate, NVIDIA/nccl-tests issue 212). NVLink SHARP (NVLS) reaches ~480 GB/s but stays off on
    # the lent machines (NCCL_NVLS_ENABLE=0), so the ring figure is used.
    intra_allreduce_busbw=368 * GB,
    # non-all-reduce collectives see the same ~370 GB/s effective NVLink bandwidth (nccl-tests issue 212)
    intra_alltoall_busbw=368 * GB,
    # 46-48 us for 4 B - 1 KB all-reduces over 2 nodes x 8 GPUs with one CX-7 NDR per GPU
    # (NVIDIA/nccl issue 1244, NCCL 2.21.5, NVLSTree)
    inter_latency_s=47e-6,
    # ~380 GB/s multi-node all-reduce busbw without SHARP / NVLS (NVIDIA/nccl issue 1649, quoting NVIDIA's GTC 2024
    # figures; with NVLS ~470 GB/s is expected on 2 x 8 H100 with 8 x 400G, NVIDIA/nccl issue 2409 citing
    # nccl-tests issue 309 - NVLS stays off here, as inside a node)
    inter_allreduce_busbw=380 * GB,
    # NDR 400 Gb/s: 46-49 GB/s per NIC (NVIDIA/nccl-tests issues 290 and 267); all-to-all gets one NIC per GPU
    inter_alltoall_busbw=48 * GB,
    inter_p2p_bw=48 * GB,
    # measured on two H200s (NV18, NCCL 2.28.9, torch 2.11, NVLS off): eager all-reduce of 1-8,192 tokens x 7168
    # bf16, median of 20 calls each timed with CUDA events, both calls' 22 points least-squares: 66.9 us + bytes /
    # 282 GB/s (65-92 us up to 512 tokens, 476-493 us at 117 MB): benchmarks/results/2026-11-26-two-gpu-h200x2/
    # call1-calibration/collectives.json and call3-calibration/collectives.json. H100 nodes take the same (the
    # launch-bound floor is NCCL's and the host's, not the HBM's; not measured on H100).
    eager_intra_latency_s=66.9e-6,
    eager_intra_allreduce_busbw=282 * GB,
    # An eager TP layer's CPU launch beyond one GPU's, measured, not derived. SGLang 0.5.17 runs two all-reduces per
    # decoder layer at TP > 1 without DP attention (layers/communicator.py prepare_mlp after attention, models/
    # deepseek_v2.py DeepseekV2MoE.forward_normal after the experts), and on Hopper sends eager ones of up to 32 MB
    # at TP 2 (128 KB one-shot / 128 MB two-shot at TP 8) to its custom all-reduce v2 (distributed/
    # device_communicators/custom_all_reduce_v2.py, configs/custom_all_reduce_v2.py _sm90_config; the servers' logs
    # print its 'All Reduce config'), one JIT kernel per call, not NCCL: by that mechanism two launches cost tens of
    # us per layer, and no collectives measurement (NCCL's eager floor above, 33-51 us on lease 3's H100 pair up to
    # 256 tokens) explains what TP 2 adds. Measured on one two-H100 host (lease 3, R1 shape x 6 layers,
    # --disable-cuda-graph, each point's warm repeat, batch 1-256 at context 256): TP 2 - TP 1 = 2.65-5.88 ms per
    # step, mean 3.64 ms = 0.606 ms per layer (0.44-0.98: it shrinks as the batch grows); benchmarks/same_host_ab.py
    # section 4, output benchmarks/results/2026-11-26-tp-eager-layer/. Fitted on those 12 calibration points (their
    # back-test rows are in-sample since); taken for any TP > 1 (TP 4 / 8 / across nodes not measured).
    eager_tp_layer_s=0.606e-3,
    # What a cross-node TP layer costs beyond one GPU's measured floor, its reads and its two all-reduces at the
    # nccl-tests figures: not measured here. From one cited public figure, never a back-test row: DeepSeek-R1-0528 on
    # 16 H100 over InfiniBand with SGLang, concurrency 1, ISL / OSL 128: TPOT 23.1 ms (tenstorrent/tt-inference-server
    # issue 356, 2025-07-09; 23.1-24.0 ms at ISL 128-8,192; the SGLang version and flags are not in the excerpt: TP 16
    # over 2 nodes assumed). The model's step there without it is 15.3 ms (H100 floor 8.7 ms at 61 layers since the
    # lease-8 layer-count split, reads 0.9 ms, 122 all-reduces 5.7 ms), so (23.1 - 15.3) ms / 61 layers = 128 us (216 us
    # before the split, on a 3.3 ms floor); tests/perfmodel/test_fixed_costs_trace.py re-derives it. Taken for
    # H200 nodes too (the same NICs), for every forward of such a group (prefill too) and for every batch size.
    inter_tp_layer_s=0.1284e-3,
)
PUBLISHED = {"H100-SXM": HOPPER, "H200": HOPPER}


def link_figures(gpu: GpuSpec, efficiency: float = 0.8) -> LinkFigures:
    """The published figures for this GPU's nodes, else ones derived from its GpuSpec link fields."""
    if gpu.name in PUBLISHED:
        return PUBLISHED[gpu.name]
    nvlink, ib = gpu.nvlink_gb_s * GB * efficiency, gpu.ib_gb_s * GB * efficiency
    return LinkFigures(gpu.collective_latency_s, nvlink, nvlink, gpu.cross_node_latency_s, ib * 8, ib, ib)


def allreduce_s(nbytes: float, ranks: int, nodes: int, links: LinkFigures, eager: bool = False) -> float:
    """One all-reduce of `nbytes` over `ranks` GPUs on `nodes` nodes (1 or 2); `eager`: launched outside a CUDA
    graph (inside a node it then pays the measured eager floor and bandwidth where they exist)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    factor = 2 * (ranks - 1) / ranks
    if nodes <= 1 and eager and links.eager_intra_latency_s is not None and links.eager_intra_allreduce_busbw:
        return links.eager_intra_latency_s + factor * nbytes / links.eager_intra_allreduce_busbw
    if nodes <= 1:
        return links.intra_latency_s + factor * nbytes / links.intra_allreduce_busbw
    return links.inter_latency_s + factor * nbytes / links.inter_allreduce_busbw


def eager_tp_layer_launch_s(links: LinkFigures, ranks: int, measured_path: bool) -> float:
    """CPU launch one eager layer of a TP group of `ranks` costs beyond one GPU's (ForwardTerms.eager_launch_s): on the path
    lease 3 measured (`measured_path`: a decode step inside one node) TP 2 - TP 1 per layer (eager_tp_layer_s); in a
    prefill forward (TP 2 not measured against TP 1) or a group across nodes (NCCL over IB, not the node-local custom
    all-reduce) its two all-reduces' launches at the eager floor."""
    if ranks <= 1:
        return 0.0
    if measured_path and links.eager_tp_layer_s:
        return links.eager_tp_layer_s
    return 2 * (links.eager_intra_latency_s or links.intra_latency_s)


def alltoall_s(nbytes: float, ranks: int, nodes: int, links: LinkFigures) -> float:
    """One all-to-all in which every GPU sends `nbytes` in total, spread over `ranks` GPUs."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    share = (ranks - 1) / ranks * nbytes
    if nodes <= 1:
        return links.intra_latency_s + share / links.intra_alltoall_busbw
    return links.inter_latency_s + share / links.inter_alltoall_busbw


def p2p_send_s(nbytes: float, cross_node: bool, links: LinkFigures) -> float:
    """One point-to-point send (a pipeline stage boundary), across nodes or inside one."""
    if nbytes <= 0:
        return 0.0
    if cross_node:
        return links.inter_latency_s + nbytes / links.inter_p2p_bw
    return links.intra_latency_s + nbytes / links.intra_alltoall_busbw


def allgather_s(nbytes: float, ranks: int, nodes: int, links: LinkFigures, eager: bool = False) -> float:
    """One all-gather (or reduce-scatter: the same traffic) whose gathered result is `nbytes` on every GPU: each GPU
    moves (n - 1) / n of it, half an all-reduce's bytes (an all-reduce is a reduce-scatter plus an all-gather).
    `eager` as allreduce_s."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    factor = (ranks - 1) / ranks
    if nodes <= 1 and eager and links.eager_intra_latency_s is not None and links.eager_intra_allreduce_busbw:
        return links.eager_intra_latency_s + factor * nbytes / links.eager_intra_allreduce_busbw
    if nodes <= 1:
        return links.intra_latency_s + factor * nbytes / links.intra_allreduce_busbw
    return links.inter_latency_s + factor * nbytes / links.inter_allreduce_busbw
