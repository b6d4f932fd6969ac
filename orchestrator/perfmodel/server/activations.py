"""Activation headroom of one engine server (ActivationTerms): the transient buffers of a prefill chunk and of an
eager decode step, the graphs' buffers, and whether the reserve outside the static pool holds them."""

from __future__ import annotations

import math

from orchestrator.perfmodel import sglang_defaults as sgd
from orchestrator.perfmodel.server.memory import MemoryTerms

# The activation estimate names only the largest buffers; allocator fragmentation and kernel workspaces add
# to them. Measured on one H200 with the R1 layer shape (chunked prefill 8192): 3.7 GB free OOMed, ~27 GB
# free ran, so the factor lies between ~1x and ~6x of our estimate there; 1.5 is an assumption in that range.
# The eager decode outcomes with committed logs (runs.yaml's memory rows, 2026-11-26) bound it without fitting it:
# the R1-shaped TP 1 OOM at 512 needs more than 1.39, the V2-Lite TP 2 server that ran 1000 eager at most 1.64.
ACTIVATION_HEADROOM = 1.5


class ActivationTerms(MemoryTerms):
    """Transient bytes outside the static pool, and the headroom check (ACTIVATION_HEADROOM)."""

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
        """Memory outside the static pool once started: 1 GiB (CUDA context, NCCL, allocator slack: the 8 logged starts
        of the back-test's memory rows leave 0.30-1.01 GiB for it, tests/perfmodel/test_backtest.py, so 1 GiB is their top) +
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
