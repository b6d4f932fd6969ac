"""Weight formats and parameter counts of a DeepSeek-style MLA + MoE model (bytes per GPU come from here).

ModelArchitecture -> ParamCounts (attention, dense MLP, shared / routed experts, embeddings) and, per
weight format, bytes per parameter class -> checkpoint bytes; expert-hit fraction of a decode batch.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from orchestrator.config.model_presets import ModelArchitecture


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
    """Count attention (MLA or GQA), dense MLP, shared/routed experts, embeddings (R1 -> ~671e9 total)."""
    h = arch.hidden_size
    qk_head = arch.qk_head_dim
    if arch.q_lora_rank:
        q_proj = h * arch.q_lora_rank + arch.q_lora_rank * arch.num_attention_heads * qk_head
    else:
        q_proj = h * arch.num_attention_heads * qk_head
    if arch.is_mla:
        kv_a = h * (arch.kv_lora_rank + arch.qk_rope_head_dim)
        kv_b = arch.kv_lora_rank * arch.num_attention_heads * (arch.qk_nope_head_dim + arch.v_head_dim)
    else:  # GQA: k and v projections of the KV heads
        kv_a, kv_b = 2 * h * arch.num_key_value_heads * arch.head_dim, 0
    o_proj = arch.num_attention_heads * arch.value_head_dim * h
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


def experts_hit_fraction(tokens: int, top_k: int, n_experts: int, same_experts: bool = False,
                         measured: Sequence[tuple[int, float]] = ()) -> float:
    """Expected fraction of routed experts that `tokens` tokens touch. Real weights: each token picks top_k
    uniformly (what the probe measured with randomised gates: 56.6 / 163 / 252 of 256 at batch 8 / 32 / 128).
    `same_experts` (dummy weights, see `dummy_routing`): nearly the same experts for every token - `measured`
    (tokens, distinct experts) points, log-linear between them and flat outside, else top_k."""
    if n_experts <= 0 or tokens <= 0:
        return 0.0
    if same_experts:
        return min(1.0, _interpolate(measured, tokens) / n_experts) if measured else min(1.0, top_k / n_experts)
    return 1.0 - (1.0 - top_k / n_experts) ** tokens


def _interpolate(points: Sequence[tuple[int, float]], tokens: int) -> float:
    pts = sorted(points)
    if tokens <= pts[0][0]:
        return pts[0][1]
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        if t0 <= tokens <= t1:
            f = (math.log(tokens) - math.log(t0)) / (math.log(t1) - math.log(t0))
            return v0 + f * (v1 - v0)
    return pts[-1][1]


def dummy_routing(load_format: str | None, topk_method: str) -> bool:
    """Whether tokens route to (nearly) the same experts. Measured on one H200 (R1-shaped layers, dummy weights,
    R1's noaux_tc router; benchmarks/results/2026-11-26-dummy-routing-h200): a decode batch of 1 / 8 / 32 / 128 /
    512 tokens touches 8 / 8.5 / 9 / 10 / 10.4 of 256 routed experts per MoE layer. Why (near-zero dummy
    scores, so noaux_tc's per-expert bias decides) is not measured. Qwen3's softmax router, which has no such bias,
    was measured uniform with dummy weights (126.5 of 128 experts at batch 64: scripts/device/qwen3_probe.sh,
    benchmarks/results/2026-11-26-two-gpu-lease3-h100x2/call6-qwen3-probe); V2-Lite's greedy softmax router is
    not counted and its profile fits either way (9 % RMS). Both keep uniform routing."""
    return load_format == "dummy" and topk_method == "noaux_tc"


# A greedy decode on dummy weights follows a cycle of at most two tokens. SGLang's dummy loader seeds every
# parameter alike (model_loader/weight_utils.py initialize_dummy_weights: the values "only depend on the parameter's
# number of elements and its data type"), so an untied lm_head equals embed_tokens and every RMSNorm weight is the
# same vector w; every layer adds far less than bf16 resolves of the residual, which stays the current token's
# embedding. The next token is then argmax_v sum_i E[v,i] w_i E[x,i], a symmetric form: along its argmax chain
# B(x_t+1, x_t) never decreases, so the chain ends in a fixed point or a 2-cycle. The router reads the same normed
# embedding, so a token's experts follow from the token alone. Requests whose prompts end in the same token (a closed
# loop's chat requests all end with the template's open assistant turn, whatever their text) decode the same chain:
# a decode step of B of them routes like min(B, 2) tokens. Seen in the two-GPU closed-loop runs: ~2,000 different
# AIPerf prompts, every response the same 1,600 bytes of content, 8.0 per token
# (benchmarks/qwen3_closed_loop_terms.py, benchmarks/results/2026-11-27-qwen3-closed-loop-terms/).
DUMMY_GREEDY_CYCLE_TOKENS = 2


def decode_routing_tokens(load_format: str | None, greedy_chains: Sequence[Hashable | None],
                          tokens_per_request: int = 1) -> int | None:
    """The most distinct tokens a decode forward routes, given each request's greedy chain (the token its greedy
    decode starts from: the simulated engine keys a request by its prompt's last token id, the planner's closed loop
    all of its requests by the one chat turn; None: a chain of its own) and the tokens it decodes per request
    (speculative verify: the draft tokens). None with real weights: every token its own.

    On dummy weights the requests of one chain decode one cycle of at most DUMMY_GREEDY_CYCLE_TOKENS tokens, so a
    forward routes that many per chain (fewer where a chain holds fewer tokens), and every token of a request of its
    own."""
    if load_format != "dummy":
        return None
    one = set(greedy_chains)
    if len(one) == 1 and None not in one:  # a single chain (a closed loop's step): the planner's hot path
        return min(len(greedy_chains) * tokens_per_request, DUMMY_GREEDY_CYCLE_TOKENS)
    chains = Counter(greedy_chains)
    alone = chains.pop(None, 0)
    return (alone * tokens_per_request
            + sum(min(n * tokens_per_request, DUMMY_GREEDY_CYCLE_TOKENS) for n in chains.values()))
