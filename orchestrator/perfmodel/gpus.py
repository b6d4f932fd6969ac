from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 2**30
GB = 1e9


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's dense peak numbers, plus the fixed costs that the roofline does not capture."""

    name: str
    memory_gb: float  # datasheet capacity (GiB as the driver reports it)
    bf16_tflops: float
    fp8_tflops: float
    hbm_tb_s: float
    nvlink_gb_s: float  # per direction, per GPU
    ib_gb_s: float  # per GPU
    # The fixed GPU time of a forward beyond its weight / KV reads and collectives: the scheduler's step (sampling,
    # output processing) and each layer's small kernels (norms, rope, MoE routing). Measured, no default: the
    # CUDA-graphed decode floor of the shipped one-GPU profiles, split by two layer counts (calibration_lookup.graphed_step_floor;
    # tests/perfmodel/test_fixed_costs_trace.py holds each GPU's figures to it). It prices every forward no profile
    # measured: a TP group across nodes (the TP16 rows), every prefill forward (whose CPU launch is charged apart:
    # PrefillTerms.prefill_launch_s), and it is subtracted from each calibration prefill forward before its share is fitted.
    step_overhead_s: float
    layer_overhead_s: float
    collective_latency_s: float = 10e-6  # one small all-reduce inside a node
    cross_node_latency_s: float = 30e-6  # one small all-reduce / send across nodes
    # A NIXL transfer worker's post + wait of one KV chunk beyond its bytes (server/kv_transfer.py, fitted on 807 chunks
    # of two H200s of one host: benchmarks/results/2026-11-27-kv-mechanism/); a host's figure, taken for every GPU here
    kv_chunk_s: float = 1.28e-3
    engine_init_s: float = 30.0  # python imports, NCCL init, tokenizer, HTTP server
    # SGLang's kv_cache_allocation where no profile measured it: the median of the 146 committed dummy-weight starts
    # (0.00-0.07 s, pools of 1.4-117 GiB; benchmarks/startup_capture_by_shape.py, output
    # benchmarks/results/2026-11-27-startup-terms/); a profile's own median comes first (StartupCoeffs.kv_alloc_s). It
    # grows with the pool (~0.3 ms per GiB, r = 0.80), not priced: 0.04 s at 100 GiB, under the logs' 0.01 s stamps
    kv_alloc_s: float = 0.01
    # Share of datasheet HBM at which the fused-MoE kernel streams routed experts (None: efficiency_decode's): the
    # median of (expert bytes more) / (time more) between the dummy-weight and randomised-gate R1-shaped H200 profiles
    # (calibration_lookup.expert_stream_share, 12 points); H100 takes it on the same die and kernel (HBM3 not measured)
    routed_read_share: float | None = None
    # first-forward compiles with empty caches, beyond graph capture: ~6 s fitted on V2-Lite (2026-11-21
    # logs); the R1-shaped FP8 probe (DeepGEMM path) was ready 149 s after a cold launch with 88 s of
    # graph capture, leaving ~15 s beyond a warm start's other phases (not the "~10 min" of older docs)
    jit_cold_s: float = 15.0
    jit_warm_s: float = 5.0
    # Defaults where no calibration profile measured them (measured on H200 with V2-Lite, SGLang 0.5.17,
    # 2026-11-21 logs: warm graph capture 10-20 s for 36 sizes x 27 layers; cold +1.5 s per size).
    graph_capture_per_bs_layer_s: float = 0.012
    graph_compile_cold_per_bs_s: float = 1.5
    # An eager decode step (batch above the largest captured graph) is launched kernel by kernel from the
    # scheduler's Python thread: it lasts max(GPU work, CPU launch), CPU launch = step + layers x per-layer +
    # requests x per-request (+ each eager collective's launch). Fitted on every one-GPU eager point of SGLang
    # 0.5.17 on H100 and H200 hosts (V2-Lite 27 layers, R1 shape 6 layers): benchmarks/eager_launch_cost.py,
    # output benchmarks/results/2026-11-26-eager-launch-cost/. A host CPU's figure, taken for every GPU here.
    eager_launch_step_s: float = 3.43e-3
    eager_launch_layer_s: float = 1.76e-3
    eager_launch_per_request_s: float = 16.0e-6
    # What a client waits per request beyond the forwards: HTTP, SGLang's tokenizer manager and ZMQ hops in, the
    # scheduler's result one loop iteration later, the detokenizer's hops and the HTTP answer out. The median of
    # (client latency - modelled forward) of the launch-bound lone prompts of the two one-GPU H100 calibration
    # files (R1 shape x 6, V2-Lite x 27): benchmarks/answer_latency.py, output
    # benchmarks/results/2026-11-26-answer-latency/. Token ids in and out (no text); a host's figure, as above.
    answer_latency_s: float = 6.1e-3
    activation_headroom_check: bool = True  # False on the cpu-fast test profile ("everything fits")
    # generating random weights on the GPU (load_format dummy): the median of weight bytes / SGLang's load_weight over
    # the same 146 starts, 3.6-59 GiB per GPU (quartiles 88-138 GB/s, range 11-218; the same output as kv_alloc_s)
    dummy_init_gb_s: float = 103.7
    sm_count: int = 132  # streaming multiprocessors (H100 SXM and H200: 132); caps SGLang's triton MLA KV splits
    # What memory_gb holds beyond the memory SGLang finds free when it starts loading the weights on a GPU of its own
    # (its pool is a fraction of that free memory, MemoryTerms.free_at_load_bytes): the driver's capacity below the
    # datasheet's plus the CUDA context, torch and NCCL set-up. 1 GiB where no log measured it; H100/H200 below.
    held_before_load_gb: float = 1.0
    # more when the server spans several GPUs (NCCL communicators, custom all-reduce buffers): measured on H200 at TP2
    # (138.21 vs 139.12 GiB free at load) and PP2 (138.29); taken as the same for larger servers (not measured)
    multi_gpu_held_gb: float = 0.9

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * GIB


# Datasheet figures (NVIDIA H100 and H200 Tensor Core GPU datasheets, SXM): dense BF16 989 / FP8 1,979 TFLOPS (half the
# 1,979 / 3,958 quoted with sparsity; the same GH100 die in both), HBM3 3.35 TB/s (H100) and HBM3e 4.8 TB/s (H200),
# NVLink 4 900 GB/s bidirectional = 450 per direction; ib_gb_s is one ConnectX-7 NDR 400 Gb/s NIC per GPU, the HGX
# node of parallel/collectives.py (whose published NCCL figures, not these, price the collectives on these two GPUs).
GPU_SPECS: dict[str, GpuSpec] = {
    "H100-SXM": GpuSpec(
        name="H100-SXM", memory_gb=80, bf16_tflops=989, fp8_tflops=1979, hbm_tb_s=3.35,
        nvlink_gb_s=450, ib_gb_s=50,
        # graphed decode floor (calibration_lookup.graphed_step_floor): 0.639 ms per step (the R1-shaped H100 profile,
        # benchmarks/results/2026-11-24-calibration-h100-r1shaped/) + 44.0 us per layer (slope over R1-shaped 6 layers
        # and V2-Lite 27 layers on H200: 2026-11-26-dummy-routing-h200/, device-h200x2-2026-11-21/); the R1-shaped layer
        # has its own, measured at 4, 5, 6 layers (calibration_lookup.shape_step_floor, lease 8)
        step_overhead_s=0.639e-3, layer_overhead_s=44.0e-6, routed_read_share=0.884,
        # "Load weight begin. avail mem=78.48-78.50 GB" (GiB) in every lone-GPU H100 log of benchmarks/results (2026-11-24
        # calibration-h100-*, 2026-11-26 context-graph-padding-h100, sglang-one-h100): 80 - 78.49; the driver reports 81,559 MiB
        held_before_load_gb=1.51,
    ),
    "H200": GpuSpec(
        name="H200", memory_gb=141, bf16_tflops=989, fp8_tflops=1979, hbm_tb_s=4.8,
        nvlink_gb_s=450, ib_gb_s=50,
        # graphed decode floor, as H100's: 1.147 ms per step (the H200 profiles of R1-shaped 6 and V2-Lite 27 layers)
        step_overhead_s=1.147e-3, layer_overhead_s=44.0e-6, routed_read_share=0.884,
        # "avail mem=139.11-139.13 GB" at weight load in every lone-GPU H200 log (device-h200x2-2026-11-21, 2026-11-26
        # two-gpu-*, dummy-routing-h200): 141 - 139.12; the driver reports 143,771 MiB
        held_before_load_gb=1.88,
    ),
    # Test profile: everything fits and a 50-prompt run finishes in about a second of wall time.
    "cpu-fast": GpuSpec(
        name="cpu-fast", memory_gb=4096, bf16_tflops=1e6, fp8_tflops=2e6, hbm_tb_s=1e4,
        nvlink_gb_s=1e6, ib_gb_s=1e6, step_overhead_s=0.5e-3, layer_overhead_s=0.0,
        collective_latency_s=0.0, cross_node_latency_s=0.0, kv_chunk_s=0.2e-3,
        engine_init_s=0.3, kv_alloc_s=0.0, jit_cold_s=0.0,
        jit_warm_s=0.0, dummy_init_gb_s=1e6, graph_capture_per_bs_layer_s=0.0, graph_compile_cold_per_bs_s=0.0,
        eager_launch_step_s=0.0, eager_launch_layer_s=0.0, eager_launch_per_request_s=0.0, answer_latency_s=0.0,
        activation_headroom_check=False, held_before_load_gb=0.0, multi_gpu_held_gb=0.0,
    ),
}


def gpu_spec(name: str, memory_gb: float | None = None) -> GpuSpec:
    """The named GPU, optionally with its memory overridden (cluster.gpu_memory_gb)."""
    try:
        spec = GPU_SPECS[name]
    except KeyError:
        raise ValueError(f"GPU {name!r} has no cost-model profile; allowed: {sorted(GPU_SPECS)}") from None
    return replace(spec, memory_gb=memory_gb) if memory_gb else spec
