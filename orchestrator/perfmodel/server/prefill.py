"""Prefill time of one engine server (PrefillTerms): a batch or chunk's FLOPs (MHA or absorbed MLA attention, the
busiest DP-attention rank), at the measured shares of peak, over pipeline stages, and its eager launch."""

from __future__ import annotations

import math
from collections.abc import Sequence

from orchestrator.perfmodel import sglang_defaults as sgd
from orchestrator.perfmodel.parallel import pipeline
from orchestrator.perfmodel.server.forward import ForwardTerms

# SGLang 0.5.17 with the triton backend runs a prefill (extend) batch through MHA only when no request of it has
# cached tokens; a batch with any prefix (a chunk continuing a long prompt, a radix-cache hit) runs the absorbed
# MLA path for all its pairs (models/deepseek_common/attention_backend_handler.py, handle_attention_triton).
# Absorbed, a (query, key) pair costs 2 x heads x (kv_lora + rope) for the scores and 2 x heads x kv_lora for the
# weighted sum; its share of peak is measured (Calibration.efficiency_absorbed), never assumed.
ABSORBED_PREFILL_BACKENDS = {"triton"}


class PrefillTerms(ForwardTerms):
    """Seconds of one prefill forward."""

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
