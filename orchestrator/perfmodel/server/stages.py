"""Pipeline stages of one engine server: each stage's layers as SGLang splits them, and the weight bytes one GPU of a
stage holds, by weight class (StageWeights)."""

from __future__ import annotations

from functools import cached_property

from orchestrator.perfmodel.server.shape import ServerShape


class StageWeights(ServerShape):
    """Layers and weight bytes per pipeline stage and GPU (without PP: the whole model on one GPU of the TP group)."""

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
