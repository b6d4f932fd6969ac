"""One engine server's fields as the cost model reads them (ServerShape) and its memory terms (MemoryTerms):
weights, static pool, KV, running limits as SGLang derives them, CUDA-graph batch sizes, activation headroom.

ServerShape -> MemoryTerms -> TimingTerms (timing.py) -> EngineCostModel (costmodel.py: SGLang's defaults resolved)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from orchestrator.config.model_presets import ModelArchitecture
from orchestrator.perfmodel import sglang_defaults as sgd
from orchestrator.perfmodel.calibration import Calibration
from orchestrator.perfmodel.gpus import GpuSpec
from orchestrator.perfmodel.speculative import Speculative
from orchestrator.perfmodel.weights import ParamCounts, WeightFormat
from orchestrator.records import Role

# The activation estimate names only the largest buffers; allocator fragmentation and kernel workspaces add
# to them. Measured on one H200 with the R1 layer shape (chunked prefill 8192): 3.7 GB free OOMed, ~27 GB
# free ran, so the factor lies between ~1x and ~6x of our estimate there; 1.5 is an assumption in that range.
# The eager decode outcomes with committed logs (runs.yaml's memory rows, 2026-11-26) bound it without fitting it:
# the R1-shaped TP 1 OOM at 512 needs more than 1.39, the V2-Lite TP 2 server that ran 1000 eager at most 1.64.
ACTIVATION_HEADROOM = 1.5


@dataclass
class ServerShape:
    """The settings of one server and the shape they give it (EngineCostModel's fields, declared once here)."""

    arch: ModelArchitecture
    gpu: GpuSpec
    tp: int = 1
    dp: int = 1
    ep: int = 1
    quantization: str = "fp8"
    efficiency_prefill: float = 0.45
    efficiency_decode: float = 0.8  # timing.WEIGHT_READ_EFFICIENCY: the rate the GPUs' fixed costs were split against
    mem_fraction_static: float | None = None  # None: SGLang's default for this GPU, TP and role
    max_running_requests: int | None = None  # None: SGLang's default from the KV pool (never unlimited)
    dp_attention: bool = False
    pp: int = 1
    nnodes: int = 1
    role: Role = "aggregated"
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
    triton_split_tile_size: int | None = None  # --triton-attention-split-tile-size (None: SGLang's split count)
    max_total_tokens: int | None = None  # --max-total-tokens: cap of each scheduler's KV pool
    speculative: Speculative | None = None  # MTP: R1's draft layer (memory, KV, draft + verify steps)
    load_format: str | None = None  # dummy: every token routes to the same experts (weights.experts_hit_fraction)
    calibration: Calibration | None = None  # from a shipped profile of this GPU and layer shape
    format: WeightFormat = field(init=False, repr=False)
    params: ParamCounts = field(init=False, repr=False)
    defaults_used: list[str] = field(init=False, repr=False)

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


class MemoryTerms(ServerShape):
    """Bytes, tokens and limits of the server (resolved by EngineCostModel)."""

    # --- pipeline stages ----------------------------------------------------------------------------
    def stage_layers(self) -> list[tuple[int, int]]:
        """(dense, MoE) decoder layers of each pipeline stage (_stage_split, computed once)."""
        return self._stage_split

    @cached_property
    def _stage_split(self) -> list[tuple[int, int]]:
        """(dense, MoE) decoder layers of each pipeline stage, as SGLang 0.5.17 splits them: distributed/utils.py
        get_pp_indices gives every stage num_layers // pp consecutive layers and the last num_layers % pp stages one
        more (utils/common.py make_layers builds only a stage's own range; SGLANG_PP_LAYER_PARTITION, which overrides
        the split, is not modelled). R1's first_k_dense_replace dense layers are the first ones, so they sit on the
        first stage: R1 at PP 2 is 3 dense + 27 MoE layers, then 31 MoE layers."""
        layers, dense = self.arch.num_hidden_layers, self.arch.first_k_dense_replace
        base, extra = divmod(layers, self.pp)
        bounds, start = [], 0
        for rank in range(self.pp):
            end = start + base + (1 if rank >= self.pp - extra else 0)
            bounds.append((start, end))
            start = end
        return [(max(0, min(end, dense) - start), end - max(start, dense)) for start, end in bounds]

    def stage_shares(self, stage: int | None = None) -> tuple[float, float, float]:
        """The shares of the model's (all, dense, MoE) layers that pipeline stage `stage` holds (None: every layer)."""
        if stage is None:
            return 1.0, 1.0, 1.0
        dense, moe = self.stage_layers()[stage]
        arch = self.arch
        return ((dense + moe) / arch.num_hidden_layers, dense / max(1, arch.first_k_dense_replace),
                moe / max(1, arch.moe_layers))

    def stage_layer_count(self, stage: int | None = None) -> int:
        """Decoder layers of pipeline stage `stage` (None: all of them)."""
        return self.arch.num_hidden_layers if stage is None else sum(self.stage_layers()[stage])

    def pipeline_stages(self) -> list[int | None]:
        """The stages a forward crosses: [None] (the whole model) without PP, else each stage's index."""
        return [None] if self.pp == 1 else list(range(self.pp))

    def stage_holds_lm_head(self, stage: int | None) -> bool:
        """The last pipeline stage holds the final norm and the lm_head (0.5.17 models/deepseek_v2.py: is_last_rank)."""
        return stage is None or stage == self.pp - 1

    def stage_weight_breakdown(self, stage: int | None = None) -> dict[str, float]:
        """Bytes per GPU by weight class of pipeline stage `stage` (None: every layer, both embeddings, as one GPU of
        the TP group would hold them without PP): its own layers' weights, the input embedding on the first stage and
        the lm_head on the last (0.5.17 models/deepseek_v2.py: VocabParallelEmbedding only if pp_group.is_first_rank,
        ParallelLMHead only if is_last_rank, PPMissingLayer elsewhere). Computed once per stage (the fields it reads are
        fixed at construction): every forward reads it."""
        if stage not in self._stage_breakdowns:
            self._stage_breakdowns[stage] = self._weight_classes(stage)
        return dict(self._stage_breakdowns[stage])

    @cached_property
    def _stage_breakdowns(self) -> dict[int | None, dict[str, float]]:
        return {}

    def _weight_classes(self, stage: int | None) -> dict[str, float]:
        p, fmt = self.params, self.format
        attn_shards = self.tp // self.attn_dp  # DP attention replicates attention weights per rank
        layer_share, dense_share, moe_share = self.stage_shares(stage)
        # the input embedding is vocab-parallel over the attention-TP group (0.5.17 vocab_parallel_embedding.py
        # get_embedding_tp_kwargs: use_attn_tp_group under DP attention), the lm_head over the whole TP group
        embedding = p.embedding * fmt.embedding_bytes / attn_shards if stage in (None, 0) else 0.0
        lm_head = p.lm_head * fmt.embedding_bytes / self.tp if self.stage_holds_lm_head(stage) else 0.0
        mtp = 0.0
        if self.speculative is not None and self.stage_holds_lm_head(stage):
            # R1's MTP module: one MoE decoder layer + eh_proj (embedding, head shared)
            moe_layers = max(1, self.arch.moe_layers)
            mtp = (
                p.attention / self.arch.num_hidden_layers * fmt.dense_bytes / attn_shards
                + (p.shared_experts + p.router) / moe_layers * fmt.dense_bytes / self.tp
                + p.routed_experts / moe_layers * fmt.expert_bytes / self.tp
                + 2 * self.arch.hidden_size**2 * fmt.dense_bytes / self.tp
            )
        return {
            "mtp_draft_layer": mtp,
            "absorbed_mla_copies": self._absorbed_mla_bytes() * layer_share,
            "attention": p.attention * fmt.dense_bytes / attn_shards * layer_share,
            "dense_mlp_shared": (p.dense_mlp * dense_share + p.shared_experts * moe_share + p.router * moe_share)
            * fmt.dense_bytes / self.tp,
            "routed_experts": p.routed_experts * fmt.expert_bytes / self.tp * moe_share,
            "embeddings": embedding + lm_head,
        }

    def stage_weights_bytes(self) -> list[float]:
        """Each pipeline stage's weight bytes on one of its GPUs."""
        return [sum(self.stage_weight_breakdown(k).values()) for k in range(self.pp)]

    def heaviest_stage(self) -> int:
        """The pipeline stage whose weights are largest (ties: the later one). SGLang syncs the KV budget to it (see
        kv_bytes_per_gpu)."""
        return self._heaviest_stage

    @cached_property
    def _heaviest_stage(self) -> int:
        weights = self.stage_weights_bytes()
        return max(range(self.pp), key=lambda k: (weights[k], k))

    def weight_bytes_breakdown(self) -> dict[str, float]:
        """Bytes per GPU by weight class (the heaviest pipeline stage when pp > 1)."""
        return self.stage_weight_breakdown(self.heaviest_stage() if self.pp > 1 else 0)

    def _absorbed_mla_bytes(self) -> float:
        """SGLang's absorbed-MLA copies of kv_b_proj on one GPU (all layers): 0.5.17
        models/deepseek_common/deepseek_weight_loader.py post-load splits kv_b_proj (block FP8 dequantized to bf16 first)
        into w_kc and w_vc with .contiguous() copies for the decode path and keeps kv_b_proj for the prefill path: bf16
        kv_lora_rank x heads x (qk_nope + v) per layer, the heads of the attention rank."""
        arch = self.arch
        if not arch.is_mla:
            return 0.0
        heads = arch.num_attention_heads / max(1, self.tp // self.attn_dp)
        return arch.num_hidden_layers * arch.kv_lora_rank * heads * (arch.qk_nope_head_dim + arch.v_head_dim) * 2

    def weights_bytes_per_gpu(self) -> float:
        return sum(self.weight_bytes_breakdown().values())

    def prefill_chunk_tokens(self) -> int:
        """--chunked-prefill-size as the server runs it (EngineCostModel resolves SGLang's default)."""
        assert self.chunked_prefill_tokens is not None, "EngineCostModel resolves SGLang's default"
        return self.chunked_prefill_tokens

    def held_before_load_bytes(self) -> float:
        """What the driver, the CUDA context, torch and (a server of several GPUs) NCCL hold on one GPU before SGLang
        loads the weights (gpus.py, measured in the raw logs): outside the static pool and outside the reserve."""
        return (self.gpu.held_before_load_gb + (self.gpu.multi_gpu_held_gb if self.tp * self.pp > 1 else 0.0)) * 2**30

    def free_at_load_bytes(self) -> float:
        """The memory one GPU has free when SGLang starts loading the weights: its capacity less what is held before."""
        return self.gpu.memory_bytes - self.held_before_load_bytes()

    def static_pool_bytes(self) -> float:
        """SGLang's static pool per GPU: weights + KV cache = mem_fraction_static x the memory free at weight load.
        0.5.17 mem_cache/kv_cache_configurator.py _profile_available_bytes: KV budget = memory free after the weights -
        pre_model_load_memory x (1 - mem_fraction_static); every uncapped start in benchmarks/results logs its KV size
        within 0.03 GiB of fraction x "Load weight begin. avail mem" - weights (tests/perfmodel/test_sglang_defaults.py)."""
        fraction = self.mem_fraction_static
        assert fraction is not None, "EngineCostModel resolves SGLang's default"
        return fraction * self.free_at_load_bytes()

    def reserve_bytes(self) -> float:
        """Left for activations, CUDA graphs, NCCL buffers: GPU memory less weights and the KV pool (GPU memory -
        mem_fraction_static x the memory free at load, more when --max-total-tokens caps the pool below what the
        fraction allows)."""
        budget, weights = max(0.0, self.kv_bytes_per_gpu()), self.stage_weights_bytes()
        # the stage with the least left: its weights short of the heaviest's, plus its pool (pipeline stages)
        taken = max(self.stage_pool_bytes(k) + (weights[k] - max(weights)) for k in range(self.pp))
        return self.gpu.memory_bytes - self.static_pool_bytes() + (budget - taken)

    def kv_bytes_per_gpu(self) -> float:
        """Static pool left for the KV cache after weights (negative: the weights do not fit): SGLang's KV budget,
        the same on every GPU of the server. 0.5.17 reads the memory free before the weights and after them with
        get_available_gpu_memory(distributed=True), the minimum over every rank of the world group
        (distributed/bootstrap.py, mem_cache/kv_cache_configurator.py _profile_available_bytes), so with pipeline
        stages the heaviest stage's weights set every stage's budget."""
        return self.static_pool_bytes() - self.weights_bytes_per_gpu()

    def stage_pool_bytes(self, stage: int, budget: float | None = None) -> float:
        """Pipeline stage `stage`'s KV pool on one GPU: SGLang turns the budget into tokens of each stage's own layers
        and keeps the minimum over the stages (kv_cache_configurator.py _apply_token_constraints: all_reduce MIN over
        the PP ranks), so the stage with the most layers sets the tokens and each stage allocates them for its own
        layers; capped by --max-total-tokens."""
        free = max(0.0, self.kv_bytes_per_gpu() if budget is None else budget)
        layers = [dense + moe for dense, moe in self.stage_layers()]
        pool = free * (layers[stage] / max(layers))
        if self.max_total_tokens is None:
            return pool
        return min(pool, self.max_total_tokens * self.kv_bytes_per_gpu_token() * self.stage_shares(stage)[0])

    def kv_pool_bytes_per_gpu(self, budget: float | None = None) -> float:
        """The KV pool SGLang allocates on one GPU: its profiled budget (default: what the fraction leaves after the
        weights on a GPU of its own), capped by --max-total-tokens; with pipeline stages the heaviest stage's."""
        return self.stage_pool_bytes(self.heaviest_stage() if self.pp > 1 else 0, budget)

    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all layers and ranks: layers x (MLA: kv_lora_rank + rope; GQA: 2 x KV heads x
        head_dim) x dtype (+ the MTP layer)."""
        layers = self.arch.num_hidden_layers
        extra = 1 if self.speculative is not None else 0
        return self.arch.kv_bytes_per_token(self.kv_dtype_bytes) * (layers + extra) // layers

    def kv_bytes_per_gpu_token(self) -> float:
        """One token's KV bytes on one GPU: all of it under MLA (replicated over TP), a share of the KV heads
        under GQA (split over the attention-TP ranks)."""
        return self.kv_bytes_per_token() * self.arch.kv_share_per_rank(self.tp // self.attn_dp)

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV one server holds: MLA replicates KV over TP (GQA splits it); DP attention and replicas add;
        --max-total-tokens caps each scheduler's pool."""
        return self.kv_tokens_in(self.kv_bytes_per_gpu())

    def kv_tokens_in(self, pool_bytes_per_gpu: float) -> int:
        """The server's KV tokens when each GPU has `pool_bytes_per_gpu` for its pool (SGLang's profiled budget),
        capped per scheduler at --max-total-tokens."""
        if pool_bytes_per_gpu <= 0:
            return 0
        most_layers = max(dense + moe for dense, moe in self.stage_layers())  # sets the tokens (stage_pool_bytes)
        per_gpu_token = self.kv_bytes_per_gpu_token() * (most_layers / self.arch.num_hidden_layers)
        per_scheduler = int(pool_bytes_per_gpu // per_gpu_token)
        if self.max_total_tokens is not None:
            per_scheduler = min(per_scheduler, self.max_total_tokens)
        return per_scheduler * self.attn_dp * self.replicas

    def max_running(self) -> int:
        """Requests the server runs at once, as SGLang derives it per scheduler (DP-attention rank, replica).

        --max-running-requests (split over DP-attention ranks, capped at half the rank's KV tokens in 0.5.x),
        else clamp(tokens / context x 512, 2048, 4096) capped at tokens / 2: never unlimited.
        """
        return max(1, self.running_per_scheduler() * self.attn_dp * self.replicas)

    def running_per_scheduler(self) -> int:
        """One scheduler's running limit, which is also the size of its request pool (0.5.17
        kv_cache_configurator.resolve_max_num_reqs sizes req_to_token_pool with it)."""
        ranks = self.attn_dp * self.replicas
        per_rank_tokens = self.kv_capacity_tokens() // max(1, ranks)
        context = self.context_length or self.arch.max_position_embeddings
        requested = self.max_running_requests
        if requested is None and self.speculative is not None:
            requested = 48  # SGLang 0.5.17's speculative_hook, unless --max-running-requests is given
        return sgd.max_running_requests(self.sglang_version, per_rank_tokens, context, requested, attn_dp=self.attn_dp)

    @property
    def graph_max_bs(self) -> int:
        """--cuda-graph-max-bs as SGLang's server_args resolves it (the flag, else its GPU/TP default; 0 without
        decode graphs): what its mem_fraction_static default reserves for. The graphs it captures may stop lower
        (captured_graph_max_bs)."""
        if not self.cuda_graph or self.role == "prefill":
            return 0
        return self.cuda_graph_max_bs or sgd.cuda_graph_max_bs_default(
            self.sglang_version, self.gpu.memory_gb * 1024, self.tp
        )

    @property
    def captured_graph_max_bs(self) -> int:
        """The largest decode graph one scheduler captures, which sizes the graph buffers: graph_max_bs capped at
        its request pool (SGLang 0.5.17 runner/base_cuda_graph_runner.py get_batch_sizes_to_capture drops sizes
        above req_to_token_pool.size and adds the pool size itself), so a server capped at 256 running requests
        captures to 256 even where the default max is 512."""
        sizes = self.graph_batch_sizes()
        return max(sizes) if sizes else 0

    def graph_batch_sizes(self) -> list[int]:
        """Decode batch sizes SGLang captures at start (none on a PD prefill server or with graphs off), up to its
        request pool. A server whose weights leave no KV never starts; its list is server_args' own (the start-up
        fits read it at another layer shape's TP)."""
        if self.graph_max_bs == 0:
            return []
        req_pool = self.running_per_scheduler()
        return sgd.cuda_graph_batch_sizes(
            self.sglang_version, self.gpu.memory_gb * 1024, self.tp, self.cuda_graph_max_bs, req_pool or None
        )

    def decode_runs_eager(self, batch_size: int) -> bool:
        """True when a decode step of `batch_size` (whole server) exceeds the largest captured graph: one attention
        rank's share, and with pipeline parallelism one micro-batch's (each forward replays the graph of its own
        micro-batch size, timing.py splits the batch into min(pp, batch) of them)."""
        requests = math.ceil(batch_size / max(1, self.replicas))
        micro = max(1, min(self.pp, requests))
        return math.ceil(requests / micro / self.attn_dp) > self.graph_max_bs

    # --- activation headroom -----------------------------------------------------------------------
    # SGLang 0.5.17, sglang/srt/layers/attention/triton_backend.py: TritonAttnBackend.__init__ sets max_kv_splits
    # (--triton-attention-num-kv-splits, 8; under MLA _mla_decode_kv_splits_cap raises it to
    # max(8, min(next_pow2(SMs), next_pow2(ceil(context / 32))))); init_forward_metadata gives every eager decode
    # step fresh fp32 buffers attn_logits (bs, heads / attn-TP, max_kv_splits, v_head_dim) and attn_lse
    # (bs, heads, max_kv_splits), and only then replaces self.forward_metadata, which still holds the previous
    # step's: two eager steps in a row have both batches' buffers alive at once. The step's next-token logits are
    # fp32 (bs, vocab) on every rank (layers/logits_processor.py _get_logits: gathered over TP, then .float() in
    # _copy_logits_to_buffer; eager steps have no graph buffer to copy into), and the overlap scheduler
    # (scheduler.py event_loop_overlap, on by default) launches step N+1 before it pops step N's result, so step N's
    # logits are alive through step N+1's allocations. Both OOM lines in benchmarks/results show exactly that much
    # allocated beyond start when the new attn_logits was asked for (docs/fidelity.md, "What fits").
    def _triton_kv_splits(self) -> int:
        """max_kv_splits of SGLang's triton decode (see above): ceil(context / tile) with a split tile size."""
        context = self.context_length or self.arch.max_position_embeddings
        if self.triton_split_tile_size:
            return -(-context // self.triton_split_tile_size)
        if not self.arch.is_mla:
            return sgd.TRITON_NUM_KV_SPLITS
        by_context = 1 << max(0, math.ceil(math.log2(max(1, math.ceil(context / 32)))))
        by_sms = 1 << max(0, math.ceil(math.log2(self.gpu.sm_count)))
        return max(sgd.TRITON_NUM_KV_SPLITS, min(by_sms, by_context))

    def split_kv_bytes(self, batch: int) -> float:
        """The triton backend's fp32 split-KV buffers (attn_logits + attn_lse) for `batch` decode requests on one GPU."""
        if self.attention_backend != "triton":
            return 0.0
        heads = self.arch.num_attention_heads // max(1, self.tp // self.attn_dp)
        v_head_dim = self.arch.kv_lora_rank if self.arch.is_mla else self.arch.head_dim
        return batch * heads * self._triton_kv_splits() * (v_head_dim + 1) * 4

    def decode_logits_bytes(self, batch: int) -> float:
        """One decode step's fp32 next-token logits for `batch` requests on one GPU (the full vocabulary on every rank)."""
        return batch * self.arch.vocab_size * 4

    def decode_micro_batch(self, batch: int) -> int:
        """The requests one decode forward runs when an attention rank runs `batch`: all of them, or with pipeline
        parallelism one micro-batch's. SGLang 0.5.17 keeps pp_size micro-batches in flight (scheduler_pp_mixin.py
        init_pp_loop_state: pp_loop_size = pp_size + pp_async_batch_depth, default 0), each its own running batch
        admitted up to max_running_requests // pp_size (scheduler.py: pp_max_micro_batch_size, get_num_allocatable_reqs),
        and each stage's GPU runs them one forward at a time."""
        return math.ceil(batch / max(1, min(self.pp, batch)))

    def eager_decode_bytes(self, batch: int) -> float:
        """Transient memory of an eager decode forward when an attention rank runs `batch` requests (0 when a graph
        runs it), at the larger of its two peaks (see the block comment above; per micro-batch, decode_micro_batch):
        when its split-KV buffers are allocated, the previous forward's (the previous micro-batch under PP) and the
        previous step's fp32 logits are still alive; when its logits are made, its split-KV buffers, the previous
        logits and its own logits in bf16 and fp32. Per-layer activations (hidden states, absorbed q, MoE
        intermediates: well under 1 MB a request) come and go within a layer and are not counted."""
        micro = self.decode_micro_batch(batch)
        if micro <= self.captured_graph_max_bs:
            return 0.0
        split_kv, logits = self.split_kv_bytes(micro), self.decode_logits_bytes(micro)
        return max(2 * split_kv + logits, split_kv + 2.5 * logits)

    def prefill_activation_bytes(self) -> float:
        """A prefill chunk's transient buffers: hidden states, MLA prefill q/k/v/out, MoE intermediates of every
        (token, expert) pair, bf16."""
        arch = self.arch
        chunk = self.chunked_prefill_tokens or 0
        heads = arch.num_attention_heads / max(1, self.tp // self.attn_dp)
        topk = arch.num_experts_per_tok if arch.n_routed_experts else 0
        return (
            chunk * arch.hidden_size * 2 * 4
            + chunk * heads * (2 * arch.qk_head_dim + 2 * arch.value_head_dim) * 2
            + chunk * topk * (3 * arch.moe_intermediate_size / self.tp + arch.hidden_size) * 2
        )

    def decode_batch_per_rank(self, running: int | None = None) -> int:
        """The decode batch of one attention rank when the server runs `running` requests (default and cap:
        max_running)."""
        running = self.max_running() if running is None else min(running, self.max_running())
        return running // max(1, self.replicas * self.attn_dp)

    def activation_peak_bytes(self, running: int | None = None) -> float:
        """Peak transient memory of one forward on one GPU outside the static pool: the larger of a prefill chunk
        and an eager decode step of the batch the workload reaches (`running`, default max_running)."""
        return max(self.prefill_activation_bytes(), self.eager_decode_bytes(self.decode_batch_per_rank(running)))

    def runtime_overhead_bytes(self) -> float:
        """Memory outside the static pool once started: 1 GiB (CUDA context, NCCL, allocator slack) +
        the decode graphs' buffers (triton: the fp32 split-KV buffer and KV-index buffer sized for the
        largest captured graph batch; SGLang's own 2 MiB per graph batch size otherwise)."""
        context = self.context_length or self.arch.max_position_embeddings
        graphs = self.captured_graph_max_bs
        buffers = self.split_kv_bytes(graphs) + graphs * context * 8 if graphs else 0.0
        return 2**30 + max(buffers, 2 * graphs * 2**20)

    def free_after_start_bytes(self) -> float:
        """What the reserve leaves for activations once the server runs (less what was held before the weights)."""
        return self.reserve_bytes() - self.held_before_load_bytes() - self.runtime_overhead_bytes()

    def activation_headroom_ok(self, running: int | None = None) -> bool:
        """The reserve must hold ACTIVATION_HEADROOM x the estimated peak (see the constant)."""
        if not self.gpu.activation_headroom_check:
            return True
        return self.free_after_start_bytes() >= ACTIVATION_HEADROOM * self.activation_peak_bytes(running)
