"""Decode step time of one engine server (DecodeTerms): calibrated per-layer terms where a profile measured the shape,
else the roofline forward; micro-batches over pipeline stages, speculative decoding, eager steps beyond the graphs."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from orchestrator.perfmodel.gpus import gpu_spec
from orchestrator.perfmodel.parallel import pipeline
from orchestrator.perfmodel.server.forward import ForwardTerms
from orchestrator.perfmodel.weights import decode_routing_tokens

# Query heads one pass of the MLA decode kernel covers while reading a request's latent once: SGLang's triton
# grouped decode kernel tiles 16 heads (BLOCK_H = 16, sglang 0.5.17 kernels/ops/attention/decode_attention.py);
# FlashMLA tiles 64 query heads per block (deepseek-ai/FlashMLA), taken for FA3 too (not measured here).
MLA_HEADS_PER_PASS = {"triton": 16, "fa3": 64, "flashmla": 64, "flashinfer": 64}


def mla_passes(heads_per_gpu: float, backend: str | None) -> int:
    """Times one GPU's MLA decode kernel reads a request's latent: once per tile of its query heads."""
    return max(1, math.ceil(heads_per_gpu / MLA_HEADS_PER_PASS.get(backend or "fa3", 64)))


class DecodeTerms(ForwardTerms):
    """Seconds of one decode step."""

    def decode_step_s(self, batch_size: int, context_tokens: int,
                      greedy_chains: Sequence[Hashable | None] | None = None) -> float:
        """One decode step for `batch_size` requests whose contexts total `context_tokens` (summed over the batch);
        `greedy_chains`: each request's greedy chain, on dummy weights one chain's requests route as at most two tokens
        (weights.decode_routing_tokens; None: one routing token per request).

        A batch above the largest captured CUDA graph runs eagerly: launch-bound (eager_launch_s). With
        speculative decoding a real step is num_steps draft forwards of the MTP layer plus one verify forward
        of num_draft_tokens per request and emits `decode_tokens_per_step` tokens per request on average; the
        time returned is per emitted token (real step / accept length), so simulators keep one token per step."""
        if batch_size <= 0:
            return 0.0
        eager = self.decode_runs_eager(batch_size)
        spec = self.speculative
        if spec is None:
            return self._decode_forward_s(batch_size, context_tokens, eager, 1, greedy_chains)
        verify = self._decode_forward_s(batch_size, context_tokens, eager, spec.num_draft_tokens, greedy_chains)
        one_token = self._decode_forward_s(batch_size, context_tokens, eager, 1, greedy_chains)
        draft = (one_token - self.gpu.step_overhead_s) / self.arch.num_hidden_layers
        return (verify + spec.num_steps * draft) / spec.accept_length

    @property
    def decode_tokens_per_step(self) -> float:
        """Tokens one decode step emits per request (speculative decoding: the mean accept length)."""
        return 1.0 if self.speculative is None else self.speculative.accept_length

    def _decode_forward_s(self, batch_size: int, context_tokens: int, eager: bool, tokens_per_request: int,
                          greedy_chains: Sequence[Hashable | None] | None = None) -> float:
        """One forward over `tokens_per_request` new tokens of each of `batch_size` requests (1: plain decode)."""
        routing_tokens = (None if greedy_chains is None
                          else decode_routing_tokens(self.load_format, greedy_chains, tokens_per_request))
        share = self.replicas
        bs = math.ceil(batch_size * tokens_per_request / share)
        ctx = context_tokens / share
        if self.pp > 1:  # micro-batches: each holds 1/pp of the requests; each stage runs its own layers over it
            requests = math.ceil(batch_size / share)
            micro = pipeline.micro_batches(requests, self.pp)
            stages = [self._decode_pass_s(-(-bs // micro), ctx / micro, eager, tokens_per_request, k, routing_tokens)
                      for k in range(self.pp)]
            per_scheduler = math.ceil(requests / micro / self.attn_dp)  # each DP-attention rank schedules its own
            return pipeline.decode_round_s(stages, micro, per_scheduler)
        return self._decode_pass_s(bs, ctx, eager, tokens_per_request, routing_tokens=routing_tokens)

    def _decode_pass_s(self, bs: int, ctx: float, eager: bool, tokens_per_request: int, stage: int | None = None,
                       routing_tokens: int | None = None) -> float:
        """One decode forward of `bs` tokens over `ctx` context tokens on one model copy (`stage`: one pipeline stage's
        own layers, without the scheduler's step)."""
        cal = self.calibration
        requests = math.ceil(bs / tokens_per_request / self.attn_dp)  # one scheduler's (an attention-DP rank's)
        if cal is not None and cal.decode is not None and self._per_gpu_terms:
            gpu_s = self._calibrated_decode_s(bs, ctx, eager, stage, routing_tokens)
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
                               eager=eager, decode=True, routing_tokens=routing_tokens)
        if not self._lent_floor:  # the lent floor's path puts the backend on the attention kernel (_forward_s)
            step /= self.attention_speed
        return max(step, self.eager_launch_s(requests, stage)) if eager else step

    def _calibrated_decode_s(self, bs: int, ctx: float, eager: bool, stage: int | None = None,
                             routing_tokens: int | None = None) -> float:
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
        fixed_step = cal.decode_step_s if stage is None else 0.0  # a PP stage's scheduler step: parallel/pipeline.py
        step = (self.weight_read_s(bs, stage, routing_tokens) + self._comm_s(bs, stage, eager=eager, decode=True)
                + layers * per_layer + fixed_step)
        return step * cal.page_factor(self.page_size)
