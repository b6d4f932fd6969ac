"""GPU cost model of one SGLang engine server: weights, KV capacity, step times, transfers, start-up.

config (RunConfig group) -> EngineCostModel -> seconds and bytes, used by the simulated engine and the planner.

Every time is a roofline: max(FLOPs / (peak x efficiency), bytes / (HBM x efficiency)) plus collective
and fixed per-step costs. Units: GB = 1e9 bytes, TB/s = 1e12 B/s, TFLOPs = 1e12 FLOP/s.

Sources of the constants (dense peak, per GPU):
- H100-SXM 80 GB: 989 TFLOPs BF16, 1979 TFLOPs FP8 (dense, i.e. without the 2:4 sparsity factor),
  3.35 TB/s HBM3 -- NVIDIA H100 Tensor Core GPU datasheet.
- H200 141 GB: same Hopper compute as H100-SXM, 4.8 TB/s HBM3e -- NVIDIA H200 datasheet.
- NVLink 4: 900 GB/s bidirectional per GPU = 450 GB/s per direction -- Hopper datasheets.
- InfiniBand NDR: 400 Gb/s = 50 GB/s per GPU (one ConnectX-7 per GPU in DGX/HGX H100) -- NVIDIA DGX
  H100 user guide.
- `memory_gb` is the datasheet capacity, which the driver reports in GiB (H100: 81559 MiB ~ 80 GiB,
  H200: 143771 MiB ~ 140.4 GiB), so capacity in bytes = memory_gb x 2^30.

Assumptions (calibration knobs, not measurements; documented in docs/planning.md):
- Efficiencies: 45 % of peak FLOPs in prefill GEMMs, 60 % of HBM bandwidth in decode (config.engine.sim).
- Fixed cost per forward: a scheduler step (3 ms) plus ~0.25 ms per layer of small kernels (MoE routing,
  norms, rope); chosen so single-stream R1 decode on 8 GPUs lands near the 40-50 tok/s that public
  SGLang reports show without speculative decoding.
- Tensor parallel: two all-reduces per layer (after attention and after the MLP/MoE), bf16 activations,
  NCCL ring bus-bandwidth 80 % of link speed, hierarchical over nodes (NVLink inside, IB across).
- MLA: the compressed KV latent (kv_lora_rank + rope dims per layer) is replicated on every attention-TP
  rank, so TP does not multiply KV capacity; DP attention does (each rank holds its own requests).
- MoE: routed experts are sharded over all TP ranks (by EP or by TP, the bytes per GPU are the same).
  A decode step reads only the experts its batch hits: E x (1 - (1 - k/E)^tokens), uniform routing.
- Pipeline parallel (`--pp-size` in extra_args) splits layers: it adds memory, not speed (no
  micro-batch overlap modelled), and adds one activation send per stage boundary.
- Weight formats: bf16 = 2 B; fp8 = 1 B + one fp32 scale per 128x128 block; w4a8 = int4 routed
  experts + one fp32 scale per 128 weights, attention/dense/shared experts kept at fp8; awq = int4 for
  every linear layer + fp16 scale and int4 zero per 128 weights, GEMMs in bf16. Embedding and lm_head
  stay bf16 in every format.
- Start-up: process + NCCL init, weight load (dummy = generated on GPU; real = the whole checkpoint read
  from disk on each node at `disk_gb_s`), KV allocation, decode CUDA-graph capture (not on a PD prefill
  server: SGLang disables it there), DeepGEMM JIT (~10 minutes when its cache is cold, per SGLang docs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.config.model_presets import ModelArchitecture
from orchestrator.perfmodel.gpus import GB, GpuSpec, gpu_spec

if TYPE_CHECKING:
    from orchestrator.config import RunConfig, WorkerGroup



@dataclass(frozen=True)
class WeightFormat:
    """Bytes per parameter of each weight class, and the GEMM dtype, for one checkpoint format."""

    expert_bytes: float  # routed experts
    dense_bytes: float  # attention, dense MLP, shared experts
    embedding_bytes: float  # embedding and lm_head
    compute: str  # "fp8" or "bf16": which peak the GEMMs run at


_FP8_BLOCK = 1 + 4 / (128 * 128)
_INT4_GROUP_FP32 = 0.5 + 4 / 128
_INT4_GROUP_FP16_ZERO = 0.5 + (2 + 0.5) / 128

WEIGHT_FORMATS: dict[str, WeightFormat] = {
    "bf16": WeightFormat(2.0, 2.0, 2.0, "bf16"),
    "fp8": WeightFormat(_FP8_BLOCK, _FP8_BLOCK, 2.0, "fp8"),
    "w4a8": WeightFormat(_INT4_GROUP_FP32, _FP8_BLOCK, 2.0, "fp8"),
    "awq": WeightFormat(_INT4_GROUP_FP16_ZERO, _INT4_GROUP_FP16_ZERO, 2.0, "bf16"),
}


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by class, from the architecture numbers (whole model, all layers)."""

    attention: float
    dense_mlp: float
    shared_experts: float
    router: float
    routed_experts: float
    one_expert_per_layer: float  # one routed expert of one MoE layer
    embedding: float
    lm_head: float

    @property
    def total(self) -> float:
        return (
            self.attention + self.dense_mlp + self.shared_experts + self.router + self.routed_experts
            + self.embedding + self.lm_head
        )


def param_counts(arch: ModelArchitecture) -> ParamCounts:
    """Count MLA attention, dense MLP, shared/routed experts, embeddings (R1 -> ~671e9 total)."""
    h = arch.hidden_size
    qk_head = arch.qk_nope_head_dim + arch.qk_rope_head_dim
    if arch.q_lora_rank:
        q_proj = h * arch.q_lora_rank + arch.q_lora_rank * arch.num_attention_heads * qk_head
    else:
        q_proj = h * arch.num_attention_heads * qk_head
    kv_a = h * (arch.kv_lora_rank + arch.qk_rope_head_dim)
    kv_b = arch.kv_lora_rank * arch.num_attention_heads * (arch.qk_nope_head_dim + arch.v_head_dim)
    o_proj = arch.num_attention_heads * arch.v_head_dim * h
    attention_per_layer = q_proj + kv_a + kv_b + o_proj
    one_expert = 3 * h * arch.moe_intermediate_size  # gate, up, down
    return ParamCounts(
        attention=attention_per_layer * arch.num_hidden_layers,
        dense_mlp=3 * h * arch.intermediate_size * arch.first_k_dense_replace,
        shared_experts=one_expert * arch.n_shared_experts * arch.moe_layers,
        router=h * arch.n_routed_experts * arch.moe_layers,
        routed_experts=one_expert * arch.n_routed_experts * arch.moe_layers,
        one_expert_per_layer=one_expert,
        embedding=arch.vocab_size * h,
        lm_head=arch.vocab_size * h,
    )


def checkpoint_bytes(arch: ModelArchitecture, quantization: str) -> float:
    """Bytes of the whole checkpoint in one weight format."""
    p = param_counts(arch)
    fmt = weight_format(quantization)
    return (
        p.routed_experts * fmt.expert_bytes
        + (p.attention + p.dense_mlp + p.shared_experts + p.router) * fmt.dense_bytes
        + (p.embedding + p.lm_head) * fmt.embedding_bytes
    )


def weight_format(quantization: str) -> WeightFormat:
    try:
        return WEIGHT_FORMATS[quantization]
    except KeyError:
        raise ValueError(
            f"model.quantization={quantization!r} has no weight format; allowed: {sorted(WEIGHT_FORMATS)}"
        ) from None


def experts_hit_fraction(tokens: int, top_k: int, n_experts: int) -> float:
    """Expected fraction of routed experts that `tokens` tokens touch, each picking top_k uniformly."""
    if n_experts <= 0 or tokens <= 0:
        return 0.0
    return 1.0 - (1.0 - top_k / n_experts) ** tokens


@dataclass
class EngineCostModel:
    """Timing and memory of one engine server (tp x dp x pp GPUs) for one model and weight format."""

    arch: ModelArchitecture
    gpu: GpuSpec
    tp: int = 1
    dp: int = 1
    ep: int = 1
    quantization: str = "fp8"
    efficiency_prefill: float = 0.45
    efficiency_decode: float = 0.6
    mem_fraction_static: float = 0.88
    max_running_requests: int | None = None
    dp_attention: bool = False
    pp: int = 1
    nnodes: int = 1
    role: str = "aggregated"  # prefill | decode | aggregated
    kv_dtype_bytes: int = 2  # SGLang's kv_cache_dtype=auto keeps the latent in bf16
    chunked_prefill_tokens: int = 8192  # SGLang's default --chunked-prefill-size on 80-160 GB GPUs
    context_length: int | None = None
    comm_efficiency: float = 0.8
    format: WeightFormat = field(init=False, repr=False)
    params: ParamCounts = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.format = weight_format(self.quantization)
        self.params = param_counts(self.arch)
        if self.dp_attention and self.tp % self.dp:
            raise ValueError(f"dp_attention needs tp divisible by dp (tp={self.tp}, dp={self.dp})")

    # --- shape -----------------------------------------------------------------------------------
    @property
    def attn_dp(self) -> int:
        """Attention data-parallel ranks inside one TP group (DP attention)."""
        return self.dp if self.dp_attention else 1

    @property
    def replicas(self) -> int:
        """Independent model copies inside the server (plain --dp-size without DP attention)."""
        return 1 if self.dp_attention else self.dp

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.replicas

    @property
    def gpus_per_node(self) -> int:
        return -(-self.gpus // self.nnodes)

    @property
    def _tp_spans_nodes(self) -> bool:
        return self.nnodes > 1 and self.pp == 1 and self.tp > self.gpus_per_node

    # --- memory ----------------------------------------------------------------------------------
    def weight_bytes_breakdown(self) -> dict[str, float]:
        """Bytes per GPU by weight class (the heaviest pipeline stage when pp > 1)."""
        p, fmt = self.params, self.format
        attn_shards = self.tp // self.attn_dp  # DP attention replicates attention weights per rank
        per_layer_share = 1 / self.pp
        embeddings = (p.embedding + p.lm_head) * fmt.embedding_bytes / self.tp
        if self.pp > 1:  # first stage holds the embedding, last the lm_head
            embeddings = max(p.embedding, p.lm_head) * fmt.embedding_bytes / self.tp
        return {
            "attention": p.attention * fmt.dense_bytes / attn_shards * per_layer_share,
            "dense_mlp_shared": (p.dense_mlp + p.shared_experts + p.router) * fmt.dense_bytes / self.tp
            * per_layer_share,
            "routed_experts": p.routed_experts * fmt.expert_bytes / self.tp * per_layer_share,
            "embeddings": embeddings,
        }

    def weights_bytes_per_gpu(self) -> float:
        return sum(self.weight_bytes_breakdown().values())

    def static_pool_bytes(self) -> float:
        """SGLang's static pool per GPU: weights + KV cache = mem_fraction_static x GPU memory."""
        return self.mem_fraction_static * self.gpu.memory_bytes

    def reserve_bytes(self) -> float:
        """Left for activations, CUDA graphs, NCCL buffers: (1 - mem_fraction_static) x GPU memory."""
        return self.gpu.memory_bytes - self.static_pool_bytes()

    def kv_bytes_per_gpu(self) -> float:
        """Static pool left for the KV cache after weights (negative: the weights do not fit)."""
        return self.static_pool_bytes() - self.weights_bytes_per_gpu()

    def kv_bytes_per_token(self) -> int:
        """MLA latent bytes of one token over all layers: layers x (kv_lora_rank + rope) x dtype."""
        return self.arch.kv_bytes_per_token(self.kv_dtype_bytes)

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV one server holds: MLA replicates KV over TP; DP attention and replicas add."""
        free = self.kv_bytes_per_gpu()
        if free <= 0:
            return 0
        per_gpu_token = self.kv_bytes_per_token() / self.pp  # each stage holds its layers' KV
        return int(free // per_gpu_token) * self.attn_dp * self.replicas

    def max_running(self) -> int:
        """--max-running-requests, else SGLang's default: clamp(tokens/context*512, 2048, 4096), <= tokens/2."""
        if self.max_running_requests is not None:
            return self.max_running_requests
        tokens = self.kv_capacity_tokens()
        context = self.context_length or self.arch.max_position_embeddings
        default = min(max(int(tokens / context * 512), 2048), 4096)
        return max(1, min(default, tokens // 2))

    # --- time ------------------------------------------------------------------------------------
    def _peak_flops(self) -> float:
        tflops = self.gpu.fp8_tflops if self.format.compute == "fp8" else self.gpu.bf16_tflops
        return tflops * 1e12

    def _allreduce_s(self, nbytes: float) -> float:
        """One NCCL all-reduce over the TP group: ring inside a node, hierarchical across nodes."""
        tp = self.tp
        if tp <= 1 or nbytes <= 0:
            return 0.0
        nvlink = self.gpu.nvlink_gb_s * GB * self.comm_efficiency
        if not self._tp_spans_nodes:
            return self.gpu.collective_latency_s + 2 * (tp - 1) / tp * nbytes / nvlink
        per_node = self.gpus_per_node
        ib = self.gpu.ib_gb_s * GB * self.comm_efficiency
        intra = 2 * (per_node - 1) / per_node * nbytes / nvlink
        inter = 2 * (self.nnodes - 1) / self.nnodes * (nbytes / per_node) / ib
        return self.gpu.cross_node_latency_s + intra + inter

    def _forward_s(
        self,
        tokens: int,
        attention_flops: float,
        kv_read_tokens: float,
        lm_head_tokens: int,
    ) -> float:
        """One forward of `tokens` tokens on one model copy: roofline + collectives + fixed costs."""
        if tokens <= 0:
            return 0.0
        p, fmt, arch = self.params, self.format, self.arch
        active_dense = p.attention + p.dense_mlp + p.shared_experts + p.router
        routed_active = tokens * arch.num_experts_per_tok * arch.moe_layers * p.one_expert_per_layer
        flops = 2 * (tokens * active_dense + routed_active + lm_head_tokens * p.lm_head) + attention_flops
        compute_s = flops / (self.tp * self._peak_flops() * self.efficiency_prefill)

        w = self.weight_bytes_breakdown()
        pp = self.pp  # timing walks every stage in turn, so count all layers' bytes on one stage's GPUs
        hit = experts_hit_fraction(tokens, arch.num_experts_per_tok, arch.n_routed_experts)
        bytes_read = (
            (w["attention"] + w["dense_mlp_shared"]) * pp
            + w["routed_experts"] * pp * hit
            + p.lm_head * fmt.embedding_bytes / self.tp
            + kv_read_tokens * self.kv_bytes_per_token() / self.attn_dp
        )
        memory_s = bytes_read / (self.gpu.hbm_tb_s * 1e12 * self.efficiency_decode)

        activation_bytes = tokens * arch.hidden_size * 2
        comm_s = 2 * arch.num_hidden_layers * self._allreduce_s(activation_bytes)
        if pp > 1:
            send = activation_bytes / (self.gpu.ib_gb_s * GB * self.comm_efficiency)
            comm_s += (pp - 1) * (self.gpu.cross_node_latency_s + send)
        fixed_s = self.gpu.step_overhead_s + arch.num_hidden_layers * self.gpu.layer_overhead_s
        return max(compute_s, memory_s) + comm_s + fixed_s

    def prefill_time_s(self, new_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None) -> float:
        """One prefill forward (a batch or a chunk): new_tokens[i] computed on top of cached_tokens[i]."""
        cached = list(cached_tokens) if cached_tokens is not None else [0] * len(new_tokens)
        if len(cached) != len(new_tokens):
            raise ValueError(f"cached_tokens has {len(cached)} entries, new_tokens {len(new_tokens)}")
        arch = self.arch
        # non-absorbed MLA in prefill: per (query, key) pair, QK^T over nope+rope dims and PV over v dims
        pair_flops = 2 * arch.num_attention_heads * (
            arch.qk_nope_head_dim + arch.qk_rope_head_dim + arch.v_head_dim
        )
        pairs = sum(n * (c + (n + 1) / 2) for n, c in zip(new_tokens, cached))
        share = self.replicas
        total = sum(new_tokens)
        return self._forward_s(
            tokens=math.ceil(total / share),
            attention_flops=pair_flops * arch.num_hidden_layers * pairs / share,
            kv_read_tokens=(sum(cached) + total) / share,
            lm_head_tokens=math.ceil(sum(1 for n in new_tokens if n > 0) / share),
        )

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        """One decode step for `batch_size` requests whose contexts total `context_tokens` (summed over the batch)."""
        if batch_size <= 0:
            return 0.0
        arch = self.arch
        # absorbed MLA in decode: scores over kv_lora+rope and the weighted sum over kv_lora, per head
        ctx_flops = 2 * arch.num_attention_heads * (2 * arch.kv_lora_rank + arch.qk_rope_head_dim)
        share = self.replicas
        return self._forward_s(
            tokens=math.ceil(batch_size / share),
            attention_flops=ctx_flops * arch.num_hidden_layers * context_tokens / share,
            kv_read_tokens=context_tokens / share,
            lm_head_tokens=math.ceil(batch_size / share),
        )

    def kv_transfer_s(self, num_tokens: int, same_node: bool) -> float:
        """Moving one request's KV latent prefill -> decode over NVLink (same node) or one GPU's IB rail."""
        link_gb_s = self.gpu.nvlink_gb_s if same_node else self.gpu.ib_gb_s
        nbytes = num_tokens * self.kv_bytes_per_token()
        return self.gpu.transfer_latency_s + nbytes / (link_gb_s * GB * self.comm_efficiency)

    def startup_breakdown_s(
        self, load_format: str | None = "dummy", disk_gb_s: float = 2.0, jit_cached: bool = True
    ) -> dict[str, float]:
        """Start-up phases in seconds: init, weights, KV allocation, CUDA graphs, JIT."""
        if load_format == "dummy":
            weights_s = self.weights_bytes_per_gpu() / (self.gpu.dummy_init_gb_s * GB)
        else:  # every TP rank reads the tensors it needs; a node reads its share of the whole checkpoint
            node_bytes = checkpoint_bytes(self.arch, self.quantization) / (self.nnodes if self.pp > 1 else 1)
            weights_s = node_bytes / (disk_gb_s * GB)
        graphs = 0 if self.role == "prefill" else self.gpu.cuda_graph_batch_sizes
        scale = self.arch.num_hidden_layers / 61  # capture time grows with layers (61 = DeepSeek-R1)
        return {
            "init": self.gpu.engine_init_s,
            "weights": weights_s,
            "kv_alloc": self.gpu.kv_alloc_s,
            "cuda_graphs": graphs * self.gpu.graph_capture_per_bs_s * scale,
            "jit": self.gpu.jit_warm_s if jit_cached else self.gpu.jit_cold_s,
        }

    def startup_s(self, load_format: str | None = "dummy", disk_gb_s: float = 2.0, jit_cached: bool = True) -> float:
        """Load + CUDA graphs + JIT + init: seconds until the server could answer (before warm-up)."""
        return sum(self.startup_breakdown_s(load_format, disk_gb_s, jit_cached).values())


def _flag_value(extra_args: Sequence[str], flag: str) -> str | None:
    """Value of `--flag V` or `--flag=V` in an SGLang argument list."""
    for i, arg in enumerate(extra_args):
        if arg == flag and i + 1 < len(extra_args):
            return extra_args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def cost_model_for(cfg: RunConfig, role: str, group: WorkerGroup, gpu: str | None = None) -> EngineCostModel:
    """The cost model of one server of `group`; GPU = `gpu`, else the sim profile (sim) or cluster.gpu."""
    if gpu is None:
        gpu = cfg.sim_profile if cfg.engine.kind == "sim" else cfg.cluster.gpu
    memory_override = cfg.cluster.gpu_memory_gb if gpu == cfg.cluster.gpu else None
    pp = int(_flag_value(group.extra_args, "--pp-size") or _flag_value(group.extra_args, "--pp") or 1)
    chunk = _flag_value(group.extra_args, "--chunked-prefill-size")
    mem_fraction = _flag_value(group.extra_args, "--mem-fraction-static") or cfg.engine.sglang.mem_fraction_static
    model = EngineCostModel(
        arch=cfg.model.architecture(),
        gpu=gpu_spec(gpu, memory_override),
        tp=group.tp,
        dp=group.dp,
        ep=group.ep,
        quantization=cfg.model.quantization,
        efficiency_prefill=cfg.engine.sim.efficiency_prefill,
        efficiency_decode=cfg.engine.sim.efficiency_decode,
        max_running_requests=group.max_running_requests,
        dp_attention=group.dp_attention,
        pp=pp,
        nnodes=group.nnodes,
        role=role,
        context_length=cfg.model.context_length,
    )
    if mem_fraction is not None:
        model.mem_fraction_static = float(mem_fraction)
    if chunk is not None and int(chunk) > 0:
        model.chunked_prefill_tokens = int(chunk)
    return model
