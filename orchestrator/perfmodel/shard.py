"""The per-GPU shard of a layer: what one GPU of a TP x EP server holds of it. Two model configs whose layouts give a
GPU the same shard run the same kernels at the same sizes there, so a layer no profile measured takes the profile of
a measured model at the layout that gives its GPUs that shard (calibration_lookup.find_calibration).

ModelArchitecture + (attention TP, EP) -> LayerShard; measured models -> the stand-in (model, TP, EP) or None."""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.config.model_presets import ModelArchitecture


@dataclass(frozen=True)
class LayerShard:
    """One GPU's part of a layer: query and KV heads (GQA: KV heads / TP, one at least; MLA: the latent, replicated)
    and routed experts (n / EP); the layer's unsharded dimensions beside them, in one weight format. Not in it: the
    MoE intermediate split over TP / EP ranks inside an expert (moe_intermediate_size is the model's)."""

    hidden_size: int
    head_dim: int
    query_heads: int
    kv_heads: int
    experts: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    quantization: str

    def describe(self) -> str:
        attention = (f"{self.query_heads} query heads / the replicated {self.kv_lora_rank}-wide latent" if self.kv_lora_rank
                     else f"{self.query_heads} query / {self.kv_heads} KV heads of {self.head_dim}")
        return (f"{attention}, {self.experts} of {self.n_routed_experts} experts (top-{self.num_experts_per_tok}, "
                f"intermediate {self.moe_intermediate_size}), hidden {self.hidden_size}, {self.quantization}")


def layer_shard(arch: ModelArchitecture, quantization: str, attention_tp: int, ep: int) -> LayerShard:
    """The shard one GPU holds of `arch`'s layer at this attention TP (tp / dp under DP attention) and EP."""
    kv_heads = 0 if arch.is_mla else max(1, arch.num_key_value_heads // attention_tp)
    return LayerShard(
        hidden_size=arch.hidden_size, head_dim=arch.qk_head_dim, query_heads=arch.num_attention_heads // attention_tp,
        kv_heads=kv_heads, experts=arch.n_routed_experts // ep, n_routed_experts=arch.n_routed_experts,
        num_experts_per_tok=arch.num_experts_per_tok, moe_intermediate_size=arch.moe_intermediate_size,
        kv_lora_rank=arch.kv_lora_rank, qk_rope_head_dim=arch.qk_rope_head_dim, quantization=quantization,
    )


def _layouts(arch: ModelArchitecture) -> list[tuple[int, int]]:
    """(TP, EP) an SGLang server of `arch` can run: TP divides the query heads, EP divides TP and the experts."""
    heads, experts = arch.num_attention_heads, max(1, arch.n_routed_experts)
    return [(tp, ep) for tp in range(1, heads + 1) if heads % tp == 0
            for ep in range(1, tp + 1) if tp % ep == 0 and experts % ep == 0]


@dataclass(frozen=True)
class ShardStandIn:
    """A measured model whose layer, at (tp, ep), gives a GPU the same shard as the model being priced."""

    arch: ModelArchitecture
    tp: int
    ep: int
    shard: LayerShard

    def describe(self) -> str:
        return (f"{self.arch.name}'s profiles at TP {self.tp} x EP {self.ep}: the same per-GPU shard "
                f"({self.shard.describe()})")


def shard_stand_in(arch: ModelArchitecture, quantization: str, attention_tp: int, ep: int,
                   measured: list[ModelArchitecture]) -> ShardStandIn | None:
    """The first measured model (by name) one of whose layouts gives a GPU the shard `arch` gives it at
    (attention_tp, ep), with `arch`'s layer count and dense layers; None where none does."""
    want = layer_shard(arch, quantization, attention_tp, ep)
    for other in sorted(measured, key=lambda a: a.name):
        for tp, other_ep in _layouts(other):
            if layer_shard(other, quantization, tp, other_ep) == want:
                stand_in = replace(other, num_hidden_layers=arch.num_hidden_layers,
                                   first_k_dense_replace=arch.first_k_dense_replace)
                return ShardStandIn(stand_in, tp, other_ep, want)
    return None
