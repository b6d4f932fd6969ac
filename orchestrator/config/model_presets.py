"""Architecture numbers of the DeepSeek-class models we plan for (from their published config.json)."""

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

    @property
    def moe_layers(self) -> int:
        return self.num_hidden_layers - self.first_k_dense_replace

    @property
    def kv_elems_per_token_per_layer(self) -> int:
        """MLA caches the compressed latent plus the decoupled rope key, per layer."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def kv_bytes_per_token(self, kv_dtype_bytes: int = 2) -> int:
        return self.num_hidden_layers * self.kv_elems_per_token_per_layer * kv_dtype_bytes

    @classmethod
    def from_hf_config(cls, path: Path) -> "ModelArchitecture":
        cfg = json.loads(Path(path).read_text())
        return cls(
            name=Path(path).parent.name,
            hidden_size=cfg["hidden_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            first_k_dense_replace=cfg.get("first_k_dense_replace", 0),
            intermediate_size=cfg["intermediate_size"],
            moe_intermediate_size=cfg.get("moe_intermediate_size", cfg["intermediate_size"]),
            n_routed_experts=cfg.get("n_routed_experts") or 0,
            n_shared_experts=cfg.get("n_shared_experts") or 0,
            num_experts_per_tok=cfg.get("num_experts_per_tok") or 0,
            num_attention_heads=cfg["num_attention_heads"],
            kv_lora_rank=cfg["kv_lora_rank"],
            q_lora_rank=cfg.get("q_lora_rank"),
            qk_nope_head_dim=cfg["qk_nope_head_dim"],
            qk_rope_head_dim=cfg["qk_rope_head_dim"],
            v_head_dim=cfg["v_head_dim"],
            vocab_size=cfg["vocab_size"],
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            bos_token_id=cfg.get("bos_token_id", 0),
            eos_token_id=cfg.get("eos_token_id", 1),
            topk_method=cfg.get("topk_method") or "greedy",
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

MODEL_PRESETS: dict[str, ModelArchitecture] = {
    DEEPSEEK_R1.name: DEEPSEEK_R1,
    DEEPSEEK_V2_LITE.name: DEEPSEEK_V2_LITE,
}
