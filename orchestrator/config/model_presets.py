"""Architecture numbers of the models we plan for (from their published config.json): DeepSeek's MLA MoE
models and Qwen3's GQA MoE."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelArchitecture:
    name: str
    hidden_size: int
    num_hidden_layers: int
    first_k_dense_replace: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    num_attention_heads: int
    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    vocab_size: int
    max_position_embeddings: int
    bos_token_id: int = 0
    eos_token_id: int = 1
    # the router's expert choice: "noaux_tc" (V3/R1) adds a per-expert bias to the scores before top-k, so with
    # dummy (near-zero) weights the bias alone picks the experts and every token gets the same ones
    topk_method: str = "greedy"
    num_key_value_heads: int = 0  # GQA (kv_lora_rank 0): KV heads, each head_dim wide; MLA leaves both 0
    head_dim: int = 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return self.num_hidden_layers - self.first_k_dense_replace

    @property
    def qk_head_dim(self) -> int:
        """Width of one query/key head in attention scores (MLA: nope + rope dims)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def kv_elems_per_token_per_layer(self) -> int:
        """MLA caches the compressed latent plus the decoupled rope key; GQA a key and a value per KV head."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_key_value_heads * self.head_dim

    def kv_share_per_rank(self, attention_tp: int) -> float:
        """The fraction of a token's KV one attention-TP rank holds: MLA replicates its latent on every rank;
        GQA splits the KV heads over the ranks, one head per rank at least (replicated beyond that)."""
        if self.is_mla or attention_tp <= 1:
            return 1.0
        return max(1, self.num_key_value_heads // attention_tp) / self.num_key_value_heads

    def kv_bytes_per_token(self, kv_dtype_bytes: int = 2) -> int:
        return self.num_hidden_layers * self.kv_elems_per_token_per_layer * kv_dtype_bytes

    @classmethod
    def from_hf_config(cls, path: Path) -> "ModelArchitecture":
        """DeepSeek (MLA: kv_lora_rank, n_routed_experts) or Qwen3-MoE (GQA: num_key_value_heads, num_experts)."""
        cfg = json.loads(Path(path).read_text())
        heads = cfg["num_attention_heads"]
        mla = "kv_lora_rank" in cfg
        return cls(
            name=Path(path).parent.name,
            hidden_size=cfg["hidden_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            first_k_dense_replace=cfg.get("first_k_dense_replace", 0),
            intermediate_size=cfg["intermediate_size"],
            moe_intermediate_size=cfg.get("moe_intermediate_size", cfg["intermediate_size"]),
            n_routed_experts=cfg.get("n_routed_experts") or cfg.get("num_experts") or 0,
            n_shared_experts=cfg.get("n_shared_experts") or 0,
            num_experts_per_tok=cfg.get("num_experts_per_tok") or 0,
            num_attention_heads=heads,
            kv_lora_rank=cfg["kv_lora_rank"] if mla else 0,
            q_lora_rank=cfg.get("q_lora_rank"),
            qk_nope_head_dim=cfg["qk_nope_head_dim"] if mla else 0,
            qk_rope_head_dim=cfg["qk_rope_head_dim"] if mla else 0,
            v_head_dim=cfg["v_head_dim"] if mla else 0,
            vocab_size=cfg["vocab_size"],
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            bos_token_id=cfg.get("bos_token_id") or 0,
            eos_token_id=cfg.get("eos_token_id", 1),
            topk_method=cfg.get("topk_method") or "greedy",
            num_key_value_heads=0 if mla else cfg.get("num_key_value_heads", heads),
            head_dim=0 if mla else cfg.get("head_dim") or cfg["hidden_size"] // heads,
        )


DEEPSEEK_R1 = ModelArchitecture(
    name="DeepSeek-R1",
    hidden_size=7168,
    num_hidden_layers=61,
    first_k_dense_replace=3,
    intermediate_size=18432,
    moe_intermediate_size=2048,
    n_routed_experts=256,
    n_shared_experts=1,
    num_experts_per_tok=8,
    num_attention_heads=128,
    kv_lora_rank=512,
    q_lora_rank=1536,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    vocab_size=129280,
    max_position_embeddings=163840,
    bos_token_id=0,
    eos_token_id=1,
    topk_method="noaux_tc",
)

DEEPSEEK_V2_LITE = ModelArchitecture(
    name="DeepSeek-V2-Lite",
    hidden_size=2048,
    num_hidden_layers=27,
    first_k_dense_replace=1,
    intermediate_size=10944,
    moe_intermediate_size=1408,
    n_routed_experts=64,
    n_shared_experts=2,
    num_experts_per_tok=6,
    num_attention_heads=16,
    kv_lora_rank=512,
    q_lora_rank=None,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    vocab_size=102400,
    max_position_embeddings=163840,
    bos_token_id=100000,
    eos_token_id=100001,
)

# Qwen/Qwen3-235B-A22B-Instruct-2507-FP8, the 2026 contest's model: GQA (64 query heads, 4 KV heads of 128),
# 94 layers, all MoE (128 experts, top-8, no shared expert), block-FP8 weights ([128, 128] scales; embeddings,
# lm_head and norms stay BF16). From the model card (layers, heads, experts) and Qwen3-235B-A22B's config
# (hidden 4096, moe_intermediate 1536, head_dim 128, vocab 151936); 2507 reads 262,144 positions.
QWEN3_235B_A22B_FP8 = ModelArchitecture(
    name="qwen3-235b-a22b-fp8",
    hidden_size=4096,
    num_hidden_layers=94,
    first_k_dense_replace=0,
    intermediate_size=12288,
    moe_intermediate_size=1536,
    n_routed_experts=128,
    n_shared_experts=0,
    num_experts_per_tok=8,
    num_attention_heads=64,
    kv_lora_rank=0,
    q_lora_rank=None,
    qk_nope_head_dim=0,
    qk_rope_head_dim=0,
    v_head_dim=0,
    vocab_size=151936,
    max_position_embeddings=262144,
    bos_token_id=151643,
    eos_token_id=151645,
    num_key_value_heads=4,
    head_dim=128,
)

MODEL_PRESETS: dict[str, ModelArchitecture] = {
    DEEPSEEK_R1.name: DEEPSEEK_R1,
    DEEPSEEK_V2_LITE.name: DEEPSEEK_V2_LITE,
    QWEN3_235B_A22B_FP8.name: QWEN3_235B_A22B_FP8,
}
