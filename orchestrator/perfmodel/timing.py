"""Time terms of one engine server (TimingTerms, built on its memory terms; EngineCostModel is one): roofline
forwards, collectives, calibrated decode steps, prefill, KV transfer, start-up."""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrator.perfmodel import sglang_defaults as sgd
from orchestrator.perfmodel.gpus import GB, gpu_spec
from orchestrator.perfmodel.memory_terms import MemoryTerms
from orchestrator.perfmodel.parallel import collectives, pipeline
from orchestrator.perfmodel.weights import checkpoint_bytes, dummy_routing, experts_hit_fraction

# Share of datasheet HBM bandwidth a streaming weight read reaches; the calibration fit subtracts the weight
# reads at this rate and the model adds them back at the same rate, so only the split depends on it; the GPUs' fixed
# costs were split from the reads at it, so the roofline reads at it too (efficiency_decode's default).
WEIGHT_READ_EFFICIENCY = 0.8
# Attention backend: whole-step speed relative to fa3 (SGLang's default on Hopper) on the roofline path (a
# calibrated step already carries its profile's backend). triton -6 %: the published 2x8 H100 team report
# quoted in issue 18; flashinfer and flashmla are not measured and assumed equal to fa3.
ATTENTION_BACKEND_SPEED = {"fa3": 1.0, "flashinfer": 1.0, "flashmla": 1.0, "triton": 0.94}


# Query heads one pass of the MLA decode kernel covers while reading a request's latent once: SGLang's triton
# grouped decode kernel tiles 16 heads (BLOCK_H = 16, sglang 0.5.17 kernels/ops/attention/decode_attention.py);
# FlashMLA tiles 64 query heads per block (deepseek-ai/FlashMLA), taken for FA3 too (not measured here).
MLA_HEADS_PER_PASS = {"triton": 16, "fa3": 64, "flashmla": 64, "flashinfer": 64}


# SGLang 0.5.17 with the triton backend runs a prefill (extend) batch through MHA only when no request of it has
# cached tokens; a batch with any prefix (a chunk continuing a long prompt, a radix-cache hit) runs the absorbed
# MLA path for all its pairs (models/deepseek_common/attention_backend_handler.py, handle_attention_triton).
# Absorbed, a (query, key) pair costs 2 x heads x (kv_lora + rope) for the scores and 2 x heads x kv_lora for the
# weighted sum; its share of peak is measured (Calibration.efficiency_absorbed), never assumed.
ABSORBED_PREFILL_BACKENDS = {"triton"}


def mla_passes(heads_per_gpu: float, backend: str | None) -> int:
    """Times one GPU's MLA decode kernel reads a request's latent: once per tile of its query heads."""
    return max(1, math.ceil(heads_per_gpu / MLA_HEADS_PER_PASS.get(backend or "fa3", 64)))


# A TP group across nodes (TP16 on 2 x 8) keeps the roofline with uniform routing; True gives it one GPU's calibrated
# terms and dummy routing instead, which predicts the published TP16 runs fast (docs/fidelity.md, "TP16 across nodes").
CALIBRATED_ACROSS_NODES = False


class TimingTerms(MemoryTerms):
    """Seconds (they read the memory terms' bytes: weights streamed, KV moved)."""

    def _peak_flops(self) -> float:
        tflops = self.gpu.fp8_tflops if self.format.compute == "fp8" else self.gpu.bf16_tflops
        return tflops * 1e12

    def _allreduce_s(self, nbytes: float, eager: bool = False) -> float:
        """One NCCL all-reduce over the TP group, inside a node or across nodes (published NCCL figures; `eager`:
        outside a CUDA graph, the measured eager floor: perfmodel/parallel/collectives.py)."""
        links = collectives.link_figures(self.gpu, self.comm_efficiency)
        return collectives.allreduce_s(nbytes, self.tp, self.nnodes if self._tp_spans_nodes else 1, links, eager)

    def _forward_s(
        self,
        tokens: int,
        attention_flops: float,
        kv_read_tokens: float,
        lm_head_tokens: int,
        stage: int | None = None,
        graphed_floor: bool = False,
        eager: bool = False,
        decode: bool = False,
    ) -> float:
        """One forward of `tokens` tokens on one model copy: roofline + collectives + the GPU's measured fixed costs
        (gpus.GpuSpec), reads at efficiency_decode, routed experts at their kernel's share. `stage`: one pipeline stage's
        own layers (stage_layers: their weights and KV, the last's lm_head, a send onward; no scheduler step).
        `graphed_floor`: a graphed decode step of a shape no profile measured: its lent floor, the backend on the KV read."""
        if tokens <= 0:
            return 0.0
        share, dense, moe = self.stage_shares(stage)
        p, arch = self.params, self.arch
        active_dense = p.attention * share + p.dense_mlp * dense + p.shared_experts * moe + p.router * moe
        routed_active = tokens * arch.num_experts_per_tok * arch.moe_layers * p.one_expert_per_layer * moe
        lm_head_tokens = lm_head_tokens if self.stage_holds_lm_head(stage) else 0
        flops = 2 * (tokens * active_dense + routed_active + lm_head_tokens * p.lm_head) + attention_flops * share
        compute_s = flops / (self.tp * self._peak_flops() * self.efficiency_prefill)

        kv_bytes, hbm = kv_read_tokens * self.kv_bytes_per_gpu_token() / self.attn_dp * share, self.gpu.hbm_tb_s * 1e12
        weights, routed = self._weight_bytes_read(tokens, stage)
        routed_share = self.gpu.routed_read_share or self.efficiency_decode
        memory_s = (weights - routed + kv_bytes) / (hbm * self.efficiency_decode) + routed / (hbm * routed_share)
        step_s, layer_s = self.gpu.step_overhead_s, self.gpu.layer_overhead_s
        # a lent floor: experts at their kernel's measured share; the backend (relative to the floor's) on the attention
        # kernel alone (the KV read); the rest at the rate the floor was measured against
        cal = self.calibration if graphed_floor and self._lent_floor else None
        if cal is not None and cal.graph_step_s is not None and cal.graph_layer_s is not None:
            backend = self.attention_speed / ATTENTION_BACKEND_SPEED.get(cal.attention_backend, 1.0)
            memory_s = ((weights - routed + kv_bytes / backend) / (hbm * WEIGHT_READ_EFFICIENCY)
                        + routed / (hbm * (cal.graph_expert_read_share or WEIGHT_READ_EFFICIENCY)))
            step_s, layer_s = cal.graph_step_s, cal.graph_layer_s
        fixed_s = (step_s if stage is None else 0.0) + self.stage_layer_count(stage) * layer_s
        return max(compute_s, memory_s) + self._comm_s(tokens, stage, eager, decode) + fixed_s

    @property
    def _lent_floor(self) -> bool:
        """Is a graphed decode step priced on the GPU's lent fixed costs (a layer shape no profile measured)?"""
        cal = self.calibration
        return cal is not None and None not in (cal.graph_step_s, cal.graph_layer_s) and not self._tp_spans_nodes

    def _weight_bytes_read(self, tokens: int, stage: int | None = None) -> tuple[float, float]:
        """Weight bytes one forward of `tokens` tokens reads on one GPU (`stage`: one pipeline stage's layers, the
        lm_head on the last; None: every layer), and the routed experts' part of them (the experts its tokens hit)."""
        w = self.stage_weight_breakdown(stage)
        routed = w["routed_experts"] * self._experts_hit_fraction(tokens)
        lm_head = self.params.lm_head * self.format.embedding_bytes / self.tp * self.stage_holds_lm_head(stage)
        return w["attention"] + w["dense_mlp_shared"] + routed + lm_head, routed

    def _experts_hit_fraction(self, tokens: int) -> float:
        """Share of the routed experts one forward of `tokens` tokens reads on one GPU (the experts its tokens hit)."""
        arch = self.arch
        # dummy routing is what the R1-shaped calibration measured; a TP group across nodes has no calibrated
        # step (see _decode_pass_s) and keeps the uniform-routing roofline of issue 14
        # (a measured dummy-weight curve of the shape decides it for any router: docs/fidelity.md, Qwen3 probe rule)
        measured = self.calibration.dummy_routing if self.calibration is not None else ()
        same = (dummy_routing(self.load_format, arch.topk_method) or (self.load_format == "dummy" and bool(measured))) \
            and (CALIBRATED_ACROSS_NODES or not self._tp_spans_nodes)
        return experts_hit_fraction(tokens, arch.num_experts_per_tok, arch.n_routed_experts, same, measured)

    def weight_read_s(self, tokens: int, stage: int | None = None) -> float:
        """Weight/expert read time of one forward (of one pipeline stage's layers) at WEIGHT_READ_EFFICIENCY of HBM."""
        return self._weight_bytes_read(tokens, stage)[0] / (self.gpu.hbm_tb_s * 1e12 * WEIGHT_READ_EFFICIENCY)

    def _comm_s(self, tokens: int, stage: int | None = None, eager: bool = False, decode: bool = False) -> float:
        """TP all-reduces (two per layer) and PP stage sends of one forward of `tokens` tokens (`stage`: one stage's
        layers and its send onward, none from the last; `eager`: not replayed from a CUDA graph, as every prefill
        forward and a decode step beyond the captured sizes). With DP attention a decode step gathers and reduce-scatters
        (_dp_attention_layer_comm_s); a prefill forward (SGLang's SUM_LEN padding when a batch extends) gathers by an
        all-reduce of the zero-padded global batch and all-reduces the MLP output: TP's two all-reduces."""
        arch = self.arch
        activation_bytes = tokens * arch.hidden_size * 2
        layers = self.stage_layer_count(stage)
        if decode and self.dp_attention and self.attn_dp > 1 and self.tp == self.attn_dp:
            comm_s = layers * self._dp_attention_layer_comm_s(activation_bytes, eager)
        else:  # TP; a DP-attention prefill; DP attention with attention TP > 1 (see _dp_attention_layer_comm_s)
            comm_s = 2 * layers * self._allreduce_s(activation_bytes, eager)
        if self._tp_spans_nodes:  # a cross-node TP layer's cost beyond its all-reduces (cited: collectives.HOPPER)
            comm_s += layers * (collectives.link_figures(self.gpu, self.comm_efficiency).inter_tp_layer_s or 0.0)
        if self.pp > 1:
            links = collectives.link_figures(self.gpu, self.comm_efficiency)
            send = collectives.p2p_send_s(activation_bytes, self.nnodes > 1, links)
            comm_s += (self.pp - 1) * send if stage is None else (send if stage < self.pp - 1 else 0.0)
        return comm_s

    def _dp_attention_layer_comm_s(self, global_bytes: float, eager: bool) -> float:
        """One decode layer's collectives under DP attention with attention TP 1 (dp = tp, SGLang 0.5.17
        layers/dp_attention.py and layers/communicator.py): each rank's attention output is gathered into the global
        batch before the MoE / MLP (MAX_LEN padding, as inside a CUDA graph and for balanced decode batches:
        all_gather_into_tensor over the TP group) and the MLP output reduce-scattered back to each rank's own tokens
        (dp_reduce_scatter_tensor): one all-gather and one reduce-scatter of the global tokens, two launches as TP's
        two all-reduces with half their bytes. Attention TP > 1 inside a DP rank adds a reduce-scatter and an
        all-gather of the rank's own tokens inside its attention TP group (four launches per layer); that path was
        not read end to end (its scattered-input and fusion options) and keeps TP's two all-reduces in _comm_s:
        charged as four launches it would move the TP8 x PP2 x DP-attention 2 team row from -14.9 % to -19.2 %
        (docs/fidelity.md, "DP attention and context at TP > 1")."""
        links = collectives.link_figures(self.gpu, self.comm_efficiency)
        nodes = self.nnodes if self._tp_spans_nodes else 1
        return 2 * collectives.allgather_s(global_bytes, self.tp, nodes, links, eager)

    def absorbed_prefill(self, cached_tokens: Sequence[int] | None) -> bool:
        """Does a prefill batch with these cached tokens run the absorbed MLA path (see ABSORBED_PREFILL_BACKENDS)?"""
        return (self.arch.is_mla and (self.attention_backend or "fa3") in ABSORBED_PREFILL_BACKENDS
                and any(c > 0 for c in cached_tokens or ()))

    def _pair_flops(self, absorbed: bool) -> float:
        """FLOPs of one (query, key) pair in one layer: QK^T over the q/k head dims and PV over the v dims
        (non-absorbed MLA, or GQA); absorbed MLA: scores over kv_lora + rope, the sum over kv_lora."""
        arch = self.arch
        if absorbed:
            return 2 * arch.num_attention_heads * (2 * arch.kv_lora_rank + arch.qk_rope_head_dim)
        return 2 * arch.num_attention_heads * (arch.qk_head_dim + arch.value_head_dim)

    def _prefill_args(self, new_tokens: Sequence[int], cached_tokens: Sequence[int] | None, absorbed: bool = False) -> dict:
        cached = list(cached_tokens) if cached_tokens is not None else [0] * len(new_tokens)
        if len(cached) != len(new_tokens):
            raise ValueError(f"cached_tokens has {len(cached)} entries, new_tokens {len(new_tokens)}")
        arch = self.arch
        pair_flops = self._pair_flops(absorbed)
        pairs = sum(n * (c + (n + 1) / 2) for n, c in zip(new_tokens, cached))
        share = self.replicas
        total = sum(new_tokens)
        args = dict(
            tokens=math.ceil(total / share),
            attention_flops=pair_flops * arch.num_hidden_layers * pairs / share,
            kv_read_tokens=(sum(cached) + total) / share,
            lm_head_tokens=math.ceil(sum(1 for n in new_tokens if n > 0) / share),
        )
        if self.dp_attention and self.attn_dp > 1:
            busiest_tokens, busiest_pairs = self._busiest_attention_rank(new_tokens, cached, pair_flops)
            # the busiest rank's attention (projections and pairs, its own requests at all its heads) sets the
            # forward, where the division by tp assumed every rank an equal share: the difference is added
            args["attention_flops"] += pair_flops * arch.num_hidden_layers * (busiest_pairs * self.attn_dp - pairs)
            args["rank_gemm_flops"] = 2 * self.params.attention * (busiest_tokens * self.attn_dp - total)
        return args

    def _busiest_attention_rank(self, new_tokens: Sequence[int], cached: Sequence[int], pair_flops: float) -> tuple[int, float]:
        """(new tokens, attention pairs) of the busiest DP-attention rank of one prefill forward. Each rank runs the
        attention of its own requests with the attention weights replicated (attention TP = tp / dp), and the ranks
        step in lockstep (SGLang's DP attention gathers every rank's tokens for the MoE in each layer), so a forward
        lasts as long as its busiest rank's attention. A request's chunk stays on one rank; chunks go to the
        least-loaded rank, largest first (scheduling/admission.py gives each rank at most its own chunk budget)."""
        per_token = 2 * self.params.attention
        loads = [(0.0, 0, 0.0)] * self.attn_dp  # (flops per layer, tokens, pairs) per rank
        pieces = sorted(((n, n * (c + (n + 1) / 2)) for n, c in zip(new_tokens, cached) if n > 0),
                        key=lambda x: -(x[0] * per_token + x[1] * pair_flops))
        for n, pairs in pieces:
            i = min(range(self.attn_dp), key=lambda r: loads[r][0])
            load, tokens, rank_pairs = loads[i]
            loads[i] = (load + n * per_token + pairs * pair_flops, tokens + n, rank_pairs + pairs)
        _, tokens, pairs = max(loads)
        return tokens, pairs

    def prefill_compute_s(
        self, new_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None, attention: bool = True,
        absorbed: bool = False,
    ) -> float:
        """FLOP time of one prefill forward at 100 % of peak (what the prefill efficiency divides); `attention`
        False: the projections, MLPs and experts only; `absorbed`: the attention pairs priced on the absorbed path."""
        a = self._prefill_args(new_tokens, cached_tokens, absorbed)
        p = self.params
        active_dense = p.attention + p.dense_mlp + p.shared_experts + p.router
        routed = a["tokens"] * self.arch.num_experts_per_tok * self.arch.moe_layers * p.one_expert_per_layer
        flops = 2 * (a["tokens"] * active_dense + routed + a["lm_head_tokens"] * p.lm_head) + a.pop("rank_gemm_flops", 0.0)
        return (flops + (a["attention_flops"] if attention else 0.0)) / (self.tp * self._peak_flops())

    def prefill_time_s(
        self, new_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None, chunk_follows: bool = False,
    ) -> float:
        """One prefill forward (a batch or a chunk): new_tokens[i] computed on top of cached_tokens[i].

        With a calibration profile the share of peak FLOPs is the one measured for this layer shape and GPU, and a
        batch that runs the absorbed MLA path (absorbed_prefill) prices its attention pairs at the share measured
        for that path. With pipeline parallelism the chunk's stages pipeline behind the chunks that follow it:
        `chunk_follows` (another prefill chunk waits behind this one) costs the slowest stage's iteration, the last or
        a lone chunk every stage's (each its own layers, and launches: perfmodel/parallel/pipeline.py)."""
        cal = self.calibration
        gemm_share = cal.efficiency_prefill if cal is not None else None  # measured: the calibrated path
        absorbed_share = cal.efficiency_absorbed if cal is not None else None
        mha_share = cal.efficiency_attention if cal is not None else None
        absorbed = bool(gemm_share and absorbed_share and self.absorbed_prefill(cached_tokens))
        a = self._prefill_args(new_tokens, cached_tokens, absorbed)
        if gemm_share:  # the pairs at their own measured share, carried as FLOPs at the GEMMs' share
            attention_share = absorbed_share if absorbed and absorbed_share else (mha_share or gemm_share)
            a["attention_flops"] *= gemm_share / attention_share
        a["attention_flops"] += a.pop("rank_gemm_flops", 0.0)  # DP attention: the busiest rank's projections (GEMMs)
        saved = self.efficiency_prefill
        if gemm_share:
            self.efficiency_prefill = gemm_share
        try:
            stages = [self._forward_s(**a, stage=k, eager=not self.prefill_graphs) for k in self.pipeline_stages()]
        finally:
            self.efficiency_prefill = saved
        if not gemm_share:
            stages = [forward / self.attention_speed for forward in stages]
        requests = self._scheduler_requests(sum(1 for n in new_tokens if n > 0))
        if self.pp == 1:
            return stages[0]
        if not (self.prefill_graphs and sgd.prefill_graphs_captured(self.sglang_version, self.arch.is_mla)):
            stages = [max(f, self.eager_launch_s(requests, stage=k, decode=False)) for k, f in enumerate(stages)]
        return pipeline.prefill_chunk_s(stages, requests, chunk_follows)

    def _scheduler_requests(self, requests: int) -> int:
        return math.ceil(requests / self.replicas / self.attn_dp)

    def prefill_launch_s(self, requests: int) -> float:
        """CPU time to launch one prefill forward of `requests` requests kernel by kernel (0 with prefill CUDA graphs,
        or with PP, whose stages' launches prefill_time_s holds). SGLang 0.5.17 captures no prefill graph for MLA
        models (sglang_defaults.prefill_graphs_captured), so a prefill forward, like an eager decode step
        (eager_launch_s), cannot end before its launch; the step loop (scheduling/steps.py) charges it where SGLang's
        overlap loop has no previous forward to launch it behind."""
        if self.pp > 1 or (self.prefill_graphs and sgd.prefill_graphs_captured(self.sglang_version, self.arch.is_mla)):
            return 0.0
        return self.eager_launch_s(self._scheduler_requests(requests), decode=False)

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        """One decode step for `batch_size` requests whose contexts total `context_tokens` (summed over the batch).

        A batch above the largest captured CUDA graph runs eagerly: launch-bound (eager_launch_s). With
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
        if self.pp > 1:  # micro-batches: each holds 1/pp of the requests; each stage runs its own layers over it
            requests = math.ceil(batch_size / share)
            micro = pipeline.micro_batches(requests, self.pp)
            stages = [self._decode_pass_s(-(-bs // micro), ctx / micro, eager, tokens_per_request, k) for k in range(self.pp)]
            per_scheduler = math.ceil(requests / micro / self.attn_dp)  # each DP-attention rank schedules its own
            return pipeline.decode_round_s(stages, micro, per_scheduler)
        return self._decode_pass_s(bs, ctx, eager, tokens_per_request)

    def _decode_pass_s(self, bs: int, ctx: float, eager: bool, tokens_per_request: int, stage: int | None = None) -> float:
        """One decode forward of `bs` tokens over `ctx` context tokens on one model copy (`stage`: one pipeline stage's
        own layers, without the scheduler's step)."""
        cal = self.calibration
        requests = math.ceil(bs / tokens_per_request / self.attn_dp)  # one scheduler's (an attention-DP rank's)
        if cal is not None and cal.decode is not None and (CALIBRATED_ACROSS_NODES or not self._tp_spans_nodes):
            gpu_s = self._calibrated_decode_s(bs, ctx, eager, stage)
            # the page-size ratio was measured on whole steps (graphed and eager alike): it scales both
            launch_s = self.eager_launch_s(requests, stage) * cal.page_factor(self.page_size)
            return max(gpu_s, launch_s) if eager else gpu_s
        arch = self.arch
        # absorbed MLA in decode: scores over kv_lora+rope and the weighted sum over kv_lora, per head (GQA: q/k, v)
        if arch.is_mla:
            ctx_flops = 2 * arch.num_attention_heads * (2 * arch.kv_lora_rank + arch.qk_rope_head_dim)
        else:
            ctx_flops = 2 * arch.num_attention_heads * (arch.qk_head_dim + arch.value_head_dim)
        step = self._forward_s(tokens=bs, attention_flops=ctx_flops * arch.num_hidden_layers * ctx * tokens_per_request,
                               kv_read_tokens=ctx, lm_head_tokens=bs, stage=stage, graphed_floor=not self._tp_spans_nodes,
                               eager=eager, decode=True)
        if not self._lent_floor:  # the lent floor's path puts the backend on the attention kernel (_forward_s)
            step /= self.attention_speed
        return max(step, self.eager_launch_s(requests, stage)) if eager else step

    def eager_launch_s(self, requests: int, stage: int | None = None, decode: bool = True) -> float:
        """CPU time to launch one eager forward kernel by kernel (no CUDA graph): the scheduler's Python thread
        issues every layer's kernels, then processes the batch's requests, so an eager step lasts at least this
        however small its GPU work (gpus.GpuSpec eager_launch_*, fitted on one-GPU eager points by
        benchmarks/eager_launch_cost.py), plus at TP > 1 each layer's extra (collectives.eager_tp_layer_launch_s,
        measured for `decode` steps inside one node). `stage`: one pipeline stage's layers; its scheduler's per-step
        and per-request work is already the PP stage iteration (parallel/pipeline.py)."""
        gpu = self.gpu
        layers = self.stage_layer_count(stage)
        links = collectives.link_figures(gpu, self.comm_efficiency)
        tp_layer_s = collectives.eager_tp_layer_launch_s(links, self.tp, decode and not self._tp_spans_nodes)
        per_step = 0.0 if stage is not None else gpu.eager_launch_step_s + gpu.eager_launch_per_request_s * requests
        return per_step + layers * (gpu.eager_launch_layer_s + tp_layer_s)

    def _calibrated_decode_s(self, bs: int, ctx: float, eager: bool, stage: int | None = None) -> float:
        """Measured per-layer terms (profile GPU, one GPU's share) + weight reads and collectives (physics), over every
        layer or one pipeline `stage`'s (its weights; the per-layer terms, the profile's mean, for dense and MoE alike).

        The per-request term is divided over the TP ranks (heads and expert slices split). The per-context
        term is the attention kernel reading each request's MLA latent once per pass over its query heads
        (mla_passes): one GPU reads the latents of its attention-DP rank's requests (ctx / attn_dp), as many
        times as its share of the heads needs passes; it scales with the profile GPU's / this GPU's HBM and with
        the KV element size (FP8 KV reads half the bytes of the profile's bf16)."""
        cal = self.calibration
        assert cal is not None and cal.decode is not None
        c = cal.decode
        layers = self.stage_layer_count(stage)
        split = self.tp / max(1, cal.tp)
        hbm_ratio = gpu_spec(cal.gpu).hbm_tb_s / self.gpu.hbm_tb_s
        heads = self.arch.num_attention_heads
        passes = mla_passes(heads * self.attn_dp / self.tp, self.attention_backend) / mla_passes(
            heads / max(1, cal.tp), cal.attention_backend)
        kv_bytes = self.kv_dtype_bytes / cal.kv_dtype_bytes  # the latent read scales with --kv-cache-dtype
        ctx_term = c.layer_per_ctx_s * ctx / self.attn_dp * passes * hbm_ratio * kv_bytes
        per_layer = c.layer_s + c.layer_per_req_s * bs / split + ctx_term
        # eager (beyond the graphs): the same GPU work with eager collectives; its CPU launch is _decode_pass_s's
        step = self.weight_read_s(bs, stage) + self._comm_s(bs, stage, eager=eager, decode=True) + layers * per_layer
        return step * cal.page_factor(self.page_size)

    def kv_transfer_s(self, num_tokens: int, same_node: bool) -> float:
        """Moving one request's KV latent prefill -> decode: link time + the per-request delay."""
        return self.kv_transfer_link_s(num_tokens, same_node) + self.kv_transfer_delay_s()

    def kv_transfer_link_s(self, num_tokens: int, same_node: bool) -> float:
        """Link time of one request's KV latent over NVLink (same node) or one GPU's IB rail."""
        link_gb_s = self.gpu.nvlink_gb_s if same_node else self.gpu.ib_gb_s
        nbytes = num_tokens * self.kv_bytes_per_gpu_token()  # each rank sends its share on its own rail
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

        Graph capture = batch sizes x layers x the warm per-(size, layer) cost; with cold caches the first size
        compiles the kernels once (where a profile's cold log showed it; else a compile per size), a server without
        decode graphs compiles them at its first forward, and the first forwards JIT-compile.
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
        if not jit_cached and sizes:
            per_size = st.graph_bs_cold_s if st and st.graph_bs_cold_s is not None else self.gpu.graph_compile_cold_per_bs_s
            if st and st.graph_once_cold_s is not None:  # the first size compiles what the others reuse
                graphs += st.graph_once_cold_s + (sizes - 1) * per_size
            else:
                graphs += sizes * per_size
        init = st.process_s if st and st.process_s is not None else self.gpu.engine_init_s
        if jit_cached:  # a measured warm start's process time already holds whatever compiles on a warm start
            jit = 0.0 if st and st.process_s is not None else self.gpu.jit_warm_s
        else:
            jit = st.jit_cold_s if st and st.jit_cold_s is not None else self.gpu.jit_cold_s
            if not sizes and st and st.graph_once_cold_s is not None:
                # no decode graph to compile the kernels in: the first forward does (the Qwen3-shaped prefill servers'
                # warm-up forward took 61-91 s cold on H100 and 66 s on H200, as long as the decode's first graph)
                jit += st.graph_once_cold_s
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
