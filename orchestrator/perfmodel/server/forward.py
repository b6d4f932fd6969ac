"""One forward of one engine server (ForwardTerms): its roofline (FLOPs and the weight, expert and KV reads), the
GPU's fixed costs, TP / DP-attention collectives and PP sends, and the CPU launch of an eager forward."""

from __future__ import annotations

import math

from orchestrator.perfmodel import sglang_defaults as sgd
from orchestrator.perfmodel.parallel import collectives
from orchestrator.perfmodel.server import triton_gqa
from orchestrator.perfmodel.server.memory import MemoryTerms
from orchestrator.perfmodel.weights import dummy_routing, experts_hit_fraction

# Share of datasheet HBM bandwidth a streaming weight read reaches; the calibration fit subtracts the weight
# reads at this rate and the model adds them back at the same rate, so only the split depends on it; the GPUs' fixed
# costs were split from the reads at it, so the roofline reads at it too (efficiency_decode's default).
WEIGHT_READ_EFFICIENCY = 0.8
# Attention backend: whole-step speed relative to fa3 (SGLang's default on Hopper) on the roofline path (a
# calibrated step already carries its profile's backend). triton -6 %: the published 2x8 H100 team report
# quoted in issue 18; flashinfer and flashmla are not measured and assumed equal to fa3.
ATTENTION_BACKEND_SPEED = {"fa3": 1.0, "flashinfer": 1.0, "flashmla": 1.0, "triton": 0.94}

# A TP group across nodes (TP16 on 2 x 8) keeps the roofline with uniform routing; True gives it one GPU's calibrated
# terms and dummy routing instead, which predicts the published TP16 runs fast (docs/fidelity.md, "TP16 across nodes").
CALIBRATED_ACROSS_NODES = False


class ForwardTerms(MemoryTerms):
    """Seconds of one forward (they read the memory terms' bytes: weights streamed, KV moved)."""

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
        routing_tokens: int | None = None,
    ) -> float:
        """One forward of `tokens` tokens on one model copy: roofline + collectives + the GPU's measured fixed costs
        (gpus.GpuSpec), reads at efficiency_decode, routed experts at their kernel's share. `stage`: one pipeline stage's
        own layers (stage_layers: their weights and KV, the last's lm_head, a send onward; no scheduler step).
        `routing_tokens`: the most distinct tokens its MoE layers route (None: every token its own).
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
        weights, routed = self._weight_bytes_read(tokens, stage, routing_tokens)
        routed_share = self.gpu.routed_read_share or self.efficiency_decode
        memory_s = (weights - routed + kv_bytes) / (hbm * self.efficiency_decode) + routed / (hbm * routed_share)
        step_s, layer_s = self.gpu.step_overhead_s, self.gpu.layer_overhead_s
        own = self.calibration  # a shape measured at several layer counts: its own floor (calibration_lookup.shape_step_floor)
        if own is not None and own.floor_step_s is not None and own.floor_layer_s is not None:
            step_s, layer_s = own.floor_step_s, own.floor_layer_s
        # a lent floor: experts at their kernel's measured share; the backend (relative to the floor's) on the attention
        # kernel alone (the KV read); the rest at the rate the floor was measured against
        cal = self.calibration if graphed_floor and self._lent_floor else None
        if cal is not None and cal.graph_step_s is not None and cal.graph_layer_s is not None:
            backend = self.attention_speed / ATTENTION_BACKEND_SPEED.get(cal.attention_backend, 1.0)
            kv_s = kv_bytes / backend / (hbm * WEIGHT_READ_EFFICIENCY)
            memory_s = ((weights - routed) / (hbm * WEIGHT_READ_EFFICIENCY) + kv_s
                        + routed / (hbm * (cal.graph_expert_read_share or WEIGHT_READ_EFFICIENCY)))
            if decode:
                memory_s += self._triton_gqa_wait_s(tokens, kv_read_tokens, kv_s, stage)
            step_s, layer_s = cal.graph_step_s, cal.graph_layer_s
        fixed_s = (step_s if stage is None else 0.0) + self.stage_layer_count(stage) * layer_s
        return max(compute_s, memory_s) + self._comm_s(tokens, stage, eager, decode) + fixed_s

    def _triton_gqa_wait_s(self, tokens: int, kv_read_tokens: float, kv_s: float, stage: int | None = None) -> float:
        """What SGLang's Triton GQA decode attention waits beyond its KV bytes (`kv_s`, this forward's layers): each layer
        takes max(bytes, one program's 32-token iterations x their cost) (server/triton_gqa.py: with one KV head a GPU
        and a small batch a few programs walk an eighth of the context each). Decode with the Triton backend on a GQA
        layer only: MLA's splits scale with the SMs and the context (its term is the calibrated one), FA3 not measured."""
        arch = self.arch
        if self.attention_backend != "triton" or arch.is_mla or tokens <= 0 or kv_read_tokens <= 0:
            return 0.0
        attn_tp = max(1, self.tp // self.attn_dp)
        requests = max(1, math.ceil(tokens / self.attn_dp))
        max_splits = sgd.TRITON_NUM_KV_SPLITS
        if self.triton_split_tile_size:  # triton_backend.py: max_kv_splits = ceil(context length / tile)
            max_splits = -(-(self.context_length or arch.max_position_embeddings) // self.triton_split_tile_size)
        latency = triton_gqa.attention_latency_s(
            kv_read_tokens / tokens, requests, arch.num_attention_heads // attn_tp,
            max(1, arch.num_key_value_heads // attn_tp), self.gpu.sm_count, max_splits)
        layers = self.stage_layer_count(stage)
        return layers * max(0.0, latency - kv_s / max(1, layers))

    @property
    def _lent_floor(self) -> bool:
        """Is a graphed decode step priced on the GPU's lent fixed costs (a layer shape no profile measured)?"""
        cal = self.calibration
        return cal is not None and None not in (cal.graph_step_s, cal.graph_layer_s) and not self._tp_spans_nodes

    def _weight_bytes_read(self, tokens: int, stage: int | None = None,
                           routing_tokens: int | None = None) -> tuple[float, float]:
        """Weight bytes one forward of `tokens` tokens reads on one GPU (`stage`: one pipeline stage's layers, the
        lm_head on the last; None: every layer), and the routed experts' part of them (the experts its tokens hit;
        they route as at most `routing_tokens` distinct ones where that is given: weights.decode_routing_tokens)."""
        w = self.stage_weight_breakdown(stage)
        routing = tokens if routing_tokens is None else min(tokens, routing_tokens)
        routed = w["routed_experts"] * self._experts_hit_fraction(routing)
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
            and self._per_gpu_terms
        return experts_hit_fraction(tokens, arch.num_experts_per_tok, arch.n_routed_experts, same, measured)

    @property
    def _per_gpu_terms(self) -> bool:
        """Do one GPU's calibrated terms and the measured dummy routing apply (not a TP group across nodes, unless
        CALIBRATED_ACROSS_NODES)? server/decode.py's calibrated step reads it too."""
        return CALIBRATED_ACROSS_NODES or not self._tp_spans_nodes

    def weight_read_s(self, tokens: int, stage: int | None = None, routing_tokens: int | None = None) -> float:
        """Weight/expert read time of one forward (of one pipeline stage's layers) at WEIGHT_READ_EFFICIENCY of HBM."""
        return (self._weight_bytes_read(tokens, stage, routing_tokens)[0]
                / (self.gpu.hbm_tb_s * 1e12 * WEIGHT_READ_EFFICIENCY))

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

    @property
    def attention_speed(self) -> float:
        """Step speed of the attention backend relative to fa3 (ATTENTION_BACKEND_SPEED; 1.0 if unknown)."""
        return ATTENTION_BACKEND_SPEED.get(self.attention_backend or "fa3", 1.0)

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
