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
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from orchestrator.config.model_presets import ModelArchitecture
from orchestrator.perfmodel import sglang_defaults as sgd
from orchestrator.perfmodel.calibration import (
    Calibration,
    fit_decode,
    fit_prefill_efficiency,
    fit_startup,
    runtime_overhead_gb,
)
from orchestrator.perfmodel.gpus import GB, GpuSpec, gpu_spec
from orchestrator.perfmodel.profile import CalibrationProfile, find_profile, shipped_profiles

# Share of datasheet HBM bandwidth a streaming weight read reaches; the calibration fit subtracts the weight
# reads at this rate and the model adds them back at the same rate, so only the split depends on it.
WEIGHT_READ_EFFICIENCY = 0.8
# The activation estimate names only the largest buffers; allocator fragmentation and kernel workspaces add
# to them. Measured on one H200 with the R1 layer shape (chunked prefill 8192): 3.7 GB free OOMed, ~27 GB
# free ran, so the factor lies between ~1x and ~6x of our estimate there; 1.5 is an assumption in that range.
ACTIVATION_HEADROOM = 1.5
# Attention backend: whole-step speed relative to fa3 (SGLang's default on Hopper) on the roofline path (a
# calibrated step already carries its profile's backend). triton -6 %: the published 2x8 H100 team report
# quoted in issue 18; flashinfer and flashmla are not measured and assumed equal to fa3.
ATTENTION_BACKEND_SPEED = {"fa3": 1.0, "flashinfer": 1.0, "flashmla": 1.0, "triton": 0.94}
# MTP (speculative decoding with R1's own draft layer). Acceptance of the first draft token 0.85 (DeepSeek-V3
# technical report: 85-90 % for the second token), assumed to fall x0.8 per further step as SGLang chains the
# same layer: 1.85 tokens per verify at (1 step, 2 draft tokens), 2.74 at (3, 4); SGLang's docs report 1.8x
# decode speed at batch 1 and 1.5x at batch 32 on H200 TP8 (docs/basic_usage/deepseek_v3.md). With dummy
# weights the draft and the target are random, so no draft is taken as accepted (the draft cost remains).
MTP_FIRST_ACCEPT = 0.85
MTP_ACCEPT_DECAY = 0.8


def mtp_accept_length(num_steps: int, num_draft_tokens: int, dummy_weights: bool) -> float:
    """Mean tokens one verify step emits per request: 1 + sum over drafts of P(every draft so far accepted)."""
    if dummy_weights:
        return 1.0
    total, chain = 1.0, 1.0
    for step in range(min(num_steps, num_draft_tokens - 1)):
        chain *= MTP_FIRST_ACCEPT * MTP_ACCEPT_DECAY**step
        total += chain
    return total


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding as the cost model sees it: draft forwards, tokens verified, tokens accepted."""

    num_steps: int
    num_draft_tokens: int
    accept_length: float

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
    mem_fraction_static: float | None = None  # None: SGLang's default for this GPU, TP and role
    max_running_requests: int | None = None  # None: SGLang's default from the KV pool (never unlimited)
    dp_attention: bool = False
    pp: int = 1
    nnodes: int = 1
    role: str = "aggregated"  # prefill | decode | aggregated
    kv_dtype_bytes: int = 2  # SGLang's kv_cache_dtype=auto keeps the latent in bf16
    chunked_prefill_tokens: int | None = None  # None: SGLang's default --chunked-prefill-size
    context_length: int | None = None
    comm_efficiency: float = 0.8
    sglang_version: str = "0.5.17"
    cuda_graph_max_bs: int | None = None  # --cuda-graph-max-bs; None: SGLang's default for GPU and TP
    cuda_graph: bool = True  # decode CUDA graphs (False: --disable-cuda-graph)
    prefill_graphs: bool = True  # False: --disable-prefill-cuda-graph
    page_size: int = 1
    attention_backend: str | None = None  # None: SGLang's pick (FA3/flashinfer on Hopper)
    speculative: Speculative | None = None  # MTP: R1's draft layer (memory, KV, draft + verify steps)
    calibration: Calibration | None = None  # from a shipped profile of this GPU and layer shape
    format: WeightFormat = field(init=False, repr=False)
    params: ParamCounts = field(init=False, repr=False)
    defaults_used: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.format = weight_format(self.quantization)
        self.params = param_counts(self.arch)
        if self.dp_attention and self.tp % self.dp:
            raise ValueError(f"dp_attention needs tp divisible by dp (tp={self.tp}, dp={self.dp})")
        self.defaults_used = []
        self.resolve_defaults()

    def resolve_defaults(self) -> None:
        """Fill unset SGLang flags the way SGLang derives them (perfmodel/sglang_defaults.py)."""
        mem_mib = self.gpu.memory_gb * 1024
        if self.chunked_prefill_tokens is None:
            self.chunked_prefill_tokens = sgd.chunked_prefill_default(self.sglang_version, mem_mib)
            self.defaults_used.append(f"chunked_prefill_size={self.chunked_prefill_tokens}")
        if self.mem_fraction_static is None:
            self.mem_fraction_static = sgd.mem_fraction_static_default(
                self.sglang_version,
                sgd.MemFractionInputs(
                    gpu_mem_mib=mem_mib, tp=self.tp, pp=self.pp, dp=self.dp, dp_attention=self.dp_attention,
                    role=self.role, chunked_prefill_size=self.chunked_prefill_tokens,
                    graph_max_bs=self.graph_max_bs or 1, decode_graphs=self.cuda_graph and self.role != "prefill",
                    prefill_graphs=self.prefill_graphs, max_running_requests=self.max_running_requests,
                ),
            )
            self.defaults_used.append(f"mem_fraction_static={self.mem_fraction_static}")

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
        mtp = 0.0
        if self.speculative is not None:  # R1's MTP module: one MoE decoder layer + eh_proj (embedding, head shared)
            moe_layers = max(1, self.arch.moe_layers)
            mtp = (
                p.attention / self.arch.num_hidden_layers * fmt.dense_bytes / attn_shards
                + (p.shared_experts + p.router) / moe_layers * fmt.dense_bytes / self.tp
                + p.routed_experts / moe_layers * fmt.expert_bytes / self.tp
                + 2 * self.arch.hidden_size**2 * fmt.dense_bytes / self.tp
            )
        return {
            "mtp_draft_layer": mtp,
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
        """MLA latent bytes of one token over all layers: layers x (kv_lora_rank + rope) x dtype (+ the MTP layer)."""
        layers = self.arch.num_hidden_layers
        extra = 1 if self.speculative is not None else 0
        return self.arch.kv_bytes_per_token(self.kv_dtype_bytes) * (layers + extra) // layers

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV one server holds: MLA replicates KV over TP; DP attention and replicas add."""
        free = self.kv_bytes_per_gpu()
        if free <= 0:
            return 0
        per_gpu_token = self.kv_bytes_per_token() / self.pp  # each stage holds its layers' KV
        return int(free // per_gpu_token) * self.attn_dp * self.replicas

    def max_running(self) -> int:
        """Requests the server runs at once, as SGLang derives it per scheduler (DP-attention rank, replica).

        --max-running-requests (split over DP-attention ranks, capped at half the rank's KV tokens in 0.5.x),
        else clamp(tokens / context x 512, 2048, 4096) capped at tokens / 2: never unlimited.
        """
        ranks = self.attn_dp * self.replicas
        per_rank_tokens = self.kv_capacity_tokens() // max(1, ranks)
        context = self.context_length or self.arch.max_position_embeddings
        requested = self.max_running_requests
        if requested is None and self.speculative is not None:
            requested = 48  # SGLang 0.5.17's speculative_hook, unless --max-running-requests is given
        per_rank = sgd.max_running_requests(
            self.sglang_version, per_rank_tokens, context, requested, attn_dp=self.attn_dp
        )
        return max(1, per_rank * ranks)

    @property
    def graph_max_bs(self) -> int:
        """The largest decode batch (per attention rank) that replays a CUDA graph; 0 without graphs."""
        if not self.cuda_graph or self.role == "prefill":
            return 0
        return self.cuda_graph_max_bs or sgd.cuda_graph_max_bs_default(
            self.sglang_version, self.gpu.memory_gb * 1024, self.tp
        )

    def graph_batch_sizes(self) -> list[int]:
        """Decode batch sizes SGLang captures at start (none on a PD prefill server or with graphs off)."""
        if self.graph_max_bs == 0:
            return []
        req_pool = self.max_running_requests if self.max_running_requests is not None else None
        return sgd.cuda_graph_batch_sizes(
            self.sglang_version, self.gpu.memory_gb * 1024, self.tp, self.cuda_graph_max_bs, req_pool
        )

    def decode_runs_eager(self, batch_size: int) -> bool:
        """True when a decode step of `batch_size` (whole server) exceeds the largest captured graph."""
        per_rank = math.ceil(batch_size / max(1, self.replicas) / self.attn_dp)
        return per_rank > self.graph_max_bs

    # --- activation headroom -----------------------------------------------------------------------
    def _triton_kv_splits(self) -> int:
        """SGLang's MLA triton decode: max(8, min(next_pow2(SMs = 132), next_pow2(context / 32)))."""
        context = self.context_length or self.arch.max_position_embeddings
        return max(8, min(256, 1 << max(0, math.ceil(math.log2(max(1, math.ceil(context / 32)))))))

    def _attn_logits_bytes(self, batch: int) -> float:
        """The triton backend's fp32 split-KV buffer for `batch` decode requests on one GPU."""
        if self.attention_backend != "triton":
            return 0.0
        heads = self.arch.num_attention_heads / max(1, self.tp // self.attn_dp)
        return batch * heads * self._triton_kv_splits() * self.arch.kv_lora_rank * 4

    def activation_peak_bytes(self, running: int | None = None) -> float:
        """Peak transient memory of one forward on one GPU outside the static pool: the larger of a
        prefill chunk (hidden-state buffers, MLA prefill q/k/v/out, MoE intermediates of every
        (token, expert) pair, bf16) and an eager decode batch (the triton backend's per-batch split-KV
        buffer, which an eager step allocates afresh). `running`: the decode batch the workload reaches
        on this server (default: max_running)."""
        arch = self.arch
        chunk = self.chunked_prefill_tokens or 0
        heads = arch.num_attention_heads / max(1, self.tp // self.attn_dp)
        topk = arch.num_experts_per_tok if arch.n_routed_experts else 0
        prefill = (
            chunk * arch.hidden_size * 2 * 4
            + chunk * heads * (2 * (arch.qk_nope_head_dim + arch.qk_rope_head_dim) + 2 * arch.v_head_dim) * 2
            + chunk * topk * (3 * arch.moe_intermediate_size / self.tp + arch.hidden_size) * 2
        )
        running = self.max_running() if running is None else min(running, self.max_running())
        per_rank = running // max(1, self.replicas * self.attn_dp)
        eager = self._attn_logits_bytes(per_rank) if per_rank > self.graph_max_bs else 0.0
        return max(prefill, eager)

    def runtime_overhead_bytes(self) -> float:
        """Memory outside the static pool once started: 1 GiB (CUDA context, NCCL, allocator slack) +
        the decode graphs' buffers (triton: the fp32 split-KV buffer and KV-index buffer sized for the
        largest graph batch; SGLang's own 2 MiB per graph batch size otherwise)."""
        context = self.context_length or self.arch.max_position_embeddings
        graphs = self.graph_max_bs
        buffers = self._attn_logits_bytes(graphs) + graphs * context * 8 if graphs else 0.0
        return 2**30 + max(buffers, 2 * graphs * 2**20)

    def free_after_start_bytes(self) -> float:
        """What the reserve leaves for activations once the server runs."""
        return self.reserve_bytes() - self.runtime_overhead_bytes()

    def activation_headroom_ok(self, running: int | None = None) -> bool:
        """The reserve must hold ACTIVATION_HEADROOM x the estimated peak (see the constant)."""
        if not self.gpu.activation_headroom_check:
            return True
        return self.free_after_start_bytes() >= ACTIVATION_HEADROOM * self.activation_peak_bytes(running)

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

        bytes_read = self._weight_bytes_read(tokens) + kv_read_tokens * self.kv_bytes_per_token() / self.attn_dp
        memory_s = bytes_read / (self.gpu.hbm_tb_s * 1e12 * self.efficiency_decode)
        fixed_s = self.gpu.step_overhead_s + arch.num_hidden_layers * self.gpu.layer_overhead_s
        return max(compute_s, memory_s) + self._comm_s(tokens) + fixed_s

    def _weight_bytes_read(self, tokens: int) -> float:
        """Weight bytes one forward of `tokens` tokens reads on one GPU (routed experts: those hit)."""
        p, fmt, arch = self.params, self.format, self.arch
        w = self.weight_bytes_breakdown()
        pp = self.pp  # timing walks every stage in turn, so count all layers' bytes on one stage's GPUs
        hit = experts_hit_fraction(tokens, arch.num_experts_per_tok, arch.n_routed_experts)
        return (
            (w["attention"] + w["dense_mlp_shared"]) * pp
            + w["routed_experts"] * pp * hit
            + p.lm_head * fmt.embedding_bytes / self.tp
        )

    def weight_read_s(self, tokens: int) -> float:
        """Weight/expert read time of one forward at WEIGHT_READ_EFFICIENCY of datasheet HBM."""
        return self._weight_bytes_read(tokens) / (self.gpu.hbm_tb_s * 1e12 * WEIGHT_READ_EFFICIENCY)

    def _comm_s(self, tokens: int) -> float:
        """TP all-reduces (two per layer) and PP stage sends of one forward of `tokens` tokens."""
        arch = self.arch
        activation_bytes = tokens * arch.hidden_size * 2
        comm_s = 2 * arch.num_hidden_layers * self._allreduce_s(activation_bytes)
        if self.pp > 1:
            send = activation_bytes / (self.gpu.ib_gb_s * GB * self.comm_efficiency)
            comm_s += (self.pp - 1) * (self.gpu.cross_node_latency_s + send)
        return comm_s

    def prefill_compute_s(self, new_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None) -> float:
        """FLOP time of one prefill forward at 100 % of peak (what the prefill efficiency divides)."""
        saved = self.efficiency_prefill
        try:
            self.efficiency_prefill = 1.0
            return self._prefill_parts(new_tokens, cached_tokens)[0]
        finally:
            self.efficiency_prefill = saved

    def _prefill_args(self, new_tokens: Sequence[int], cached_tokens: Sequence[int] | None) -> dict:
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
        return dict(
            tokens=math.ceil(total / share),
            attention_flops=pair_flops * arch.num_hidden_layers * pairs / share,
            kv_read_tokens=(sum(cached) + total) / share,
            lm_head_tokens=math.ceil(sum(1 for n in new_tokens if n > 0) / share),
        )

    def prefill_compute_s(self, new_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None) -> float:
        """FLOP time of one prefill forward at 100 % of peak (what the prefill efficiency divides)."""
        a = self._prefill_args(new_tokens, cached_tokens)
        p = self.params
        active_dense = p.attention + p.dense_mlp + p.shared_experts + p.router
        routed = a["tokens"] * self.arch.num_experts_per_tok * self.arch.moe_layers * p.one_expert_per_layer
        flops = 2 * (a["tokens"] * active_dense + routed + a["lm_head_tokens"] * p.lm_head) + a["attention_flops"]
        return flops / (self.tp * self._peak_flops())

    def prefill_time_s(self, new_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None) -> float:
        """One prefill forward (a batch or a chunk): new_tokens[i] computed on top of cached_tokens[i].

        With a calibration profile the share of peak FLOPs is the one measured for this layer shape."""
        a = self._prefill_args(new_tokens, cached_tokens)
        if self.calibration is not None and self.calibration.efficiency_prefill:
            saved = self.efficiency_prefill
            self.efficiency_prefill = self.calibration.efficiency_prefill
            try:
                return self._forward_s(**a)
            finally:
                self.efficiency_prefill = saved
        return self._forward_s(**a) / self.attention_speed

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        """One decode step for `batch_size` requests whose contexts total `context_tokens` (summed over the batch).

        A batch above the largest captured CUDA graph runs eagerly and pays the eager cost per layer. With
        speculative decoding a real step is num_steps draft forwards of the MTP layer plus one verify forward
        of num_draft_tokens per request and emits `decode_tokens_per_step` tokens per request on average; the
        time returned is per emitted token (real step / accept length), so simulators keep one token per step."""
        if batch_size <= 0:
            return 0.0
        eager = self.decode_runs_eager(batch_size)
        spec = self.speculative
        if spec is None:
            return self._decode_forward_s(batch_size, context_tokens, eager, 1)
        verify = self._decode_forward_s(batch_size, context_tokens, eager, spec.num_draft_tokens)
        one_token = self._decode_forward_s(batch_size, context_tokens, eager, 1)
        draft = (one_token - self.gpu.step_overhead_s) / self.arch.num_hidden_layers
        return (verify + spec.num_steps * draft) / spec.accept_length

    @property
    def decode_tokens_per_step(self) -> float:
        """Tokens one decode step emits per request (speculative decoding: the mean accept length)."""
        return 1.0 if self.speculative is None else self.speculative.accept_length

    @property
    def attention_speed(self) -> float:
        """Step speed of the attention backend relative to fa3 (ATTENTION_BACKEND_SPEED; 1.0 if unknown)."""
        return ATTENTION_BACKEND_SPEED.get(self.attention_backend or "fa3", 1.0)

    def _decode_forward_s(self, batch_size: int, context_tokens: int, eager: bool, tokens_per_request: int) -> float:
        """One forward over `tokens_per_request` new tokens of each of `batch_size` requests (1: plain decode)."""
        share = self.replicas
        bs = math.ceil(batch_size * tokens_per_request / share)
        ctx = context_tokens / share
        cal = self.calibration
        if cal is not None and cal.decode is not None:
            return self._calibrated_decode_s(bs, ctx, eager)
        arch = self.arch
        # absorbed MLA in decode: scores over kv_lora+rope and the weighted sum over kv_lora, per head
        ctx_flops = 2 * arch.num_attention_heads * (2 * arch.kv_lora_rank + arch.qk_rope_head_dim)
        step = self._forward_s(
            tokens=bs,
            attention_flops=ctx_flops * arch.num_hidden_layers * ctx * tokens_per_request,
            kv_read_tokens=ctx,
            lm_head_tokens=bs,
        )
        if eager:
            step += arch.num_hidden_layers * self.gpu.eager_layer_s
        return step / self.attention_speed

    def _calibrated_decode_s(self, bs: int, ctx: float, eager: bool) -> float:
        """Measured per-layer terms (profile GPU, one GPU's share) + weight reads and collectives (physics).

        Per-request and per-context terms are divided over the TP ranks (heads and expert slices split);
        the per-context term is HBM-bound and scales with the profile GPU's / this GPU's bandwidth."""
        cal = self.calibration
        assert cal is not None and cal.decode is not None
        c = cal.decode
        layers = self.arch.num_hidden_layers
        split = self.tp / max(1, cal.tp)
        hbm_ratio = gpu_spec(cal.gpu).hbm_tb_s / self.gpu.hbm_tb_s
        per_layer = c.layer_s + c.layer_per_req_s * bs / split + c.layer_per_ctx_s * ctx / split * hbm_ratio
        if eager:
            per_layer += (c.eager_layer_s if c.eager_layer_s is not None else self.gpu.eager_layer_s)
            per_layer += (c.eager_layer_per_req_s or 0.0) * bs / split
        step = self.weight_read_s(bs) + self._comm_s(bs) + layers * per_layer
        return step * cal.page_factor(self.page_size)

    def kv_transfer_s(self, num_tokens: int, same_node: bool) -> float:
        """Moving one request's KV latent prefill -> decode: link time + the per-request delay."""
        return self.kv_transfer_link_s(num_tokens, same_node) + self.kv_transfer_delay_s()

    def kv_transfer_link_s(self, num_tokens: int, same_node: bool) -> float:
        """Link time of one request's KV latent over NVLink (same node) or one GPU's IB rail."""
        link_gb_s = self.gpu.nvlink_gb_s if same_node else self.gpu.ib_gb_s
        nbytes = num_tokens * self.kv_bytes_per_token()
        return nbytes / (link_gb_s * GB * self.comm_efficiency)

    def kv_transfer_delay_s(self) -> float:
        """Per-request time of a KV transfer beyond the link time, overlapping other transfers: SGLang's
        measured mean transfer latency at this page size (per-descriptor cost, handshakes, queueing on the
        transfer threads), scaled by layers; else the GPU's fixed handshake figure."""
        cal = self.calibration
        if cal is not None and cal.shape_matches:
            measured = cal.transfer_latency_s(self.page_size)
            if measured is not None:
                return measured * self.arch.num_hidden_layers / cal.layers
        return self.gpu.transfer_latency_s

    def startup_breakdown_s(
        self, load_format: str | None = "dummy", disk_gb_s: float = 2.0, jit_cached: bool = True
    ) -> dict[str, float]:
        """Start-up phases in seconds: init, weights, KV allocation, CUDA graphs, JIT (cold or warm caches).

        Graph capture = batch sizes x layers x the warm per-(size, layer) cost; with cold caches every
        batch size also compiles its kernels (per size, not per layer) and the first forwards JIT-compile.
        Figures come from the matching calibration profile where it measured them, else the GPU defaults."""
        if load_format == "dummy":
            weights_s = self.weights_bytes_per_gpu() / (self.gpu.dummy_init_gb_s * GB)
        else:  # every TP rank reads the tensors it needs; a node reads its share of the whole checkpoint
            node_bytes = checkpoint_bytes(self.arch, self.quantization) / (self.nnodes if self.pp > 1 else 1)
            weights_s = node_bytes / (disk_gb_s * GB)
        st = self.calibration.startup if self.calibration is not None else None
        sizes = len(self.graph_batch_sizes())
        per_bs_layer = (st.graph_bs_layer_s if st and st.graph_bs_layer_s is not None else self.gpu.graph_capture_per_bs_layer_s)
        graphs = sizes * self.arch.num_hidden_layers * per_bs_layer
        if not jit_cached:
            graphs += sizes * (st.graph_bs_cold_s if st and st.graph_bs_cold_s is not None else self.gpu.graph_compile_cold_per_bs_s)
        init = st.process_s if st and st.process_s is not None else self.gpu.engine_init_s
        if jit_cached:  # a measured warm start's process time already holds whatever compiles on a warm start
            jit = 0.0 if st and st.process_s is not None else self.gpu.jit_warm_s
        else:
            jit = st.jit_cold_s if st and st.jit_cold_s is not None else self.gpu.jit_cold_s
        return {
            "init": init,
            "weights": weights_s,
            "kv_alloc": self.gpu.kv_alloc_s,
            "cuda_graphs": graphs,
            "jit": jit,
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


def _flag_int(extra_args: Sequence[str], *flags: str) -> int | None:
    for flag in flags:
        value = _flag_value(extra_args, flag)
        if value is not None:
            return int(value)
    return None


def calibration_for(profile: CalibrationProfile, arch: ModelArchitecture, quantization: str) -> Calibration:
    """Fit a profile's points on its own shape (arch with the profile's layer count) and GPU."""
    return _calibration_cached(profile.model_dump_json(), arch, quantization)


@lru_cache(maxsize=32)
def _calibration_cached(profile_json: str, arch: ModelArchitecture, quantization: str) -> Calibration:
    profile = CalibrationProfile.model_validate_json(profile_json)
    m, e = profile.model, profile.engine
    shape = replace(arch, num_hidden_layers=m.num_hidden_layers, first_k_dense_replace=m.first_k_dense_replace)
    at_profile = EngineCostModel(
        arch=shape, gpu=gpu_spec(profile.gpu.name), tp=e.tp, dp=e.dp, dp_attention=e.dp_attention,
        quantization=quantization, sglang_version=e.sglang_version,
        mem_fraction_static=e.mem_fraction_static, chunked_prefill_tokens=e.chunked_prefill_size,
        cuda_graph_max_bs=e.cuda_graph_max_bs, page_size=e.page_size, context_length=e.context_length,
    )
    decode = fit_decode(profile.decode, m.num_hidden_layers, lambda bs: at_profile.weight_read_s(bs) + at_profile._comm_s(bs))
    fixed = at_profile.gpu.step_overhead_s + m.num_hidden_layers * at_profile.gpu.layer_overhead_s
    pairs = []
    for pt in profile.prefill:
        per = pt.new_tokens // pt.requests
        new = [per] * pt.requests
        new[-1] += pt.new_tokens - per * pt.requests
        cached = [pt.cached_tokens // pt.requests] * pt.requests
        pairs.append((at_profile.prefill_compute_s(new, cached), pt.time_s - fixed - at_profile._comm_s(pt.new_tokens)))
    startup = fit_startup(
        profile, weights_s=at_profile.weights_bytes_per_gpu() / (at_profile.gpu.dummy_init_gb_s * GB),
        kv_alloc_s=at_profile.gpu.kv_alloc_s, graph_sizes=len(at_profile.graph_batch_sizes()),
    )
    return Calibration(
        profile=profile.name, gpu=profile.gpu.name, layers=m.num_hidden_layers,
        sglang_version=e.sglang_version, tp=e.tp, decode=decode,
        efficiency_prefill=fit_prefill_efficiency(pairs), prefill_points=len(pairs), startup=startup,
        runtime_overhead_gb=runtime_overhead_gb(profile, at_profile.gpu.memory_bytes / GB), source=profile.raw,
        page_size=e.page_size,
        page_ratios=tuple((x.page_size, x.decode_step_ratio) for x in profile.page_size_effects),
        transfer_latency=tuple((x.page_size, x.time_s) for x in profile.transfer),
    )


def find_calibration(
    gpu: str, arch: ModelArchitecture, quantization: str, profiles: list[CalibrationProfile] | None = None
) -> Calibration | None:
    """The shipped profile's calibration for this GPU and layer shape; else the same shape on another GPU;
    else a profile of another shape on this GPU, whose start-up figures only apply (process start, graph
    capture per size and layer, cold compile per size do not depend on the layer's dimensions)."""
    pool = profiles if profiles is not None else shipped_profiles()
    profile = find_profile(gpu, arch, quantization, pool)
    if profile is None:
        others = [p for p in pool if p.model.matches(arch, quantization)]
        profile = others[0] if others else None
    if profile is not None:
        return calibration_for(profile, arch, quantization)
    same_gpu = [p for p in pool if p.gpu.name == gpu]
    if not same_gpu:
        return None
    other = same_gpu[0]
    cal = _startup_only(other.model_dump_json(), arch, quantization)
    return cal


@lru_cache(maxsize=32)
def _startup_only(profile_json: str, arch: ModelArchitecture, quantization: str) -> Calibration:
    profile = CalibrationProfile.model_validate_json(profile_json)
    e = profile.engine
    at_profile = EngineCostModel(
        arch=arch, gpu=gpu_spec(profile.gpu.name), tp=e.tp, quantization=quantization,
        sglang_version=e.sglang_version, mem_fraction_static=e.mem_fraction_static or 0.85,
        cuda_graph_max_bs=e.cuda_graph_max_bs, context_length=e.context_length,
    )
    startup = fit_startup(profile, weights_s=0.0, kv_alloc_s=at_profile.gpu.kv_alloc_s,
                          graph_sizes=len(at_profile.graph_batch_sizes()))
    return Calibration(
        profile=profile.name + " (start-up only: another layer shape)", gpu=profile.gpu.name,
        layers=profile.model.num_hidden_layers, sglang_version=e.sglang_version, tp=e.tp, decode=None,
        efficiency_prefill=None, prefill_points=0, startup=startup, runtime_overhead_gb=None, source=profile.raw,
        page_size=e.page_size, shape_matches=False,
    )


def cost_model_for(
    cfg: RunConfig,
    role: str,
    group: WorkerGroup,
    gpu: str | None = None,
    sglang_version: str | None = None,
    calibrated: bool = True,
) -> EngineCostModel:
    """The cost model of one server of `group`; GPU = `gpu`, else the sim profile (sim) or cluster.gpu.

    Unset SGLang flags take SGLang's own defaults (sglang_version, default 0.5.17); `calibrated` loads the
    shipped calibration profile for this GPU and layer shape (the same shape on another GPU if none)."""
    if gpu is None:
        gpu = cfg.sim_profile if cfg.engine.kind == "sim" else cfg.cluster.gpu
    memory_override = cfg.cluster.gpu_memory_gb if gpu == cfg.cluster.gpu else None
    args = list(cfg.engine.sglang.extra_args) + list(group.extra_args)
    pp = _flag_int(args, "--pp-size", "--pp") or int(getattr(group, "pp", 1) or 1)
    chunk = _flag_int(args, "--chunked-prefill-size") or getattr(group, "chunked_prefill_size", None)
    mem_fraction = (
        _flag_value(args, "--mem-fraction-static") or getattr(group, "mem_fraction_static", None)
        or cfg.engine.sglang.mem_fraction_static
    )
    graph_max = _flag_int(args, "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode")
    graph_max = graph_max or getattr(group, "cuda_graph_max_bs", None)
    spec = gpu_spec(gpu, memory_override)
    arch = cfg.model.architecture()
    version = sglang_version or getattr(cfg.engine.sglang, "version", None) or "0.5.17"
    calibration = find_calibration(spec.name, arch, cfg.model.quantization) if calibrated and gpu != "cpu-fast" else None
    draft = getattr(group, "speculative", None)
    speculative = None
    if draft is not None:
        accept = draft.accept_length or mtp_accept_length(
            draft.num_steps, draft.num_draft_tokens, dummy_weights=cfg.engine.sglang.load_format == "dummy"
        )
        speculative = Speculative(draft.num_steps, draft.num_draft_tokens, min(accept, float(draft.num_draft_tokens)))
    return EngineCostModel(
        arch=arch,
        gpu=spec,
        tp=group.tp,
        dp=group.dp,
        ep=group.ep,
        quantization=cfg.model.quantization,
        efficiency_prefill=cfg.engine.sim.efficiency_prefill,
        efficiency_decode=cfg.engine.sim.efficiency_decode,
        mem_fraction_static=float(mem_fraction) if mem_fraction is not None else None,
        max_running_requests=group.max_running_requests,
        dp_attention=group.dp_attention,
        pp=pp,
        nnodes=group.nnodes,
        role=role,
        chunked_prefill_tokens=chunk if chunk and chunk > 0 else None,
        context_length=cfg.model.context_length,
        sglang_version=version,
        cuda_graph_max_bs=graph_max,
        cuda_graph="--disable-cuda-graph" not in args,
        prefill_graphs="--disable-prefill-cuda-graph" not in args,
        page_size=cfg.engine.sglang.page_size,
        attention_backend=getattr(group, "attention_backend", None) or cfg.engine.sglang.attention_backend,
        calibration=calibration,
        speculative=speculative,
    )
