"""The servers of a run: `layout` is groups of identical SGLang servers per role (prefill, decode or aggregated),
each group's parallel shape and per-group SGLang flags (WorkerGroup), and speculative decoding with the model's MTP layer."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from orchestrator.config.spec_knobs import Parallelism
from orchestrator.config.strict import Strict
from orchestrator.records import Role

# SGLang 0.5.17's --attention-backend choices that run DeepSeek's MLA on NVIDIA GPUs (Hopper: fa3 is
# SGLang's default; cutlass_mla / trtllm_mla / fa4 need Blackwell).
MLA_ATTENTION_BACKENDS = ("fa3", "flashinfer", "flashmla", "triton", "cutlass_mla", "trtllm_mla", "fa4")


class SpeculativeConfig(Strict):
    """Speculative decoding with the checkpoint's own MTP layer (SGLang's NEXTN = EAGLE with the model as draft)."""

    algorithm: Literal["NEXTN", "EAGLE"] = Field(
        "NEXTN", description="--speculative-algorithm; SGLang resolves NEXTN to EAGLE with R1's MTP layer as draft."
    )
    num_steps: int = Field(3, ge=1, le=8, description="--speculative-num-steps (SGLang's default for R1: 3).")
    eagle_topk: int = Field(1, ge=1, le=8, description="--speculative-eagle-topk (default 1).")
    num_draft_tokens: int = Field(4, ge=2, le=32, description="--speculative-num-draft-tokens (default 4).")
    accept_length: float | None = Field(
        None, ge=1, description="Cost-model assumption: mean tokens emitted per verify step; default 1.0 with "
        "dummy weights (random drafts are rejected), else from an assumed per-token acceptance (docs/planning.md)."
    )

    @model_validator(mode="after")
    def _draft_tokens_fit_steps(self) -> "SpeculativeConfig":
        most = self.num_steps * self.eagle_topk + 1
        if self.num_draft_tokens > most:
            raise ValueError(
                f"num_draft_tokens={self.num_draft_tokens} exceeds num_steps x eagle_topk + 1 = {most}; "
                f"lower num_draft_tokens or raise num_steps"
            )
        return self


class WorkerGroup(Strict):
    name: str | None = Field(None, description="Deployment name; default '<role>-<index>'.")
    count: int = Field(1, ge=1, description="Number of engine servers (replicas) in this group.")
    tp: int = Field(1, ge=1, description="Tensor-parallel size of one server (per pipeline stage).")
    dp: int = Field(1, ge=1, description="Data-parallel size inside one server.")
    ep: int = Field(1, ge=1, description="Expert-parallel size inside one server (--ep-size): 1 or tp.")
    pp: int = Field(1, ge=1, description="Pipeline-parallel size of one server (e.g. TP8xPP2 over 2 nodes).")
    dp_attention: bool = Field(False, description="--enable-dp-attention: attention runs dp-way data parallel "
                               "inside the tp group (tp divisible by dp); KV is no longer replicated over TP.")
    moe_a2a_backend: Literal["none", "deepep"] | None = Field(
        None, description="--moe-a2a-backend; deepep needs ep = tp (DeepEP installed); null = SGLang's default (none)."
    )
    nnodes: int = Field(1, ge=1, description="Nodes one server spans (e.g. TP16 over 2 nodes).")
    node_role: str | None = Field(None, description="Node role label; default from the group's role.")
    max_running_requests: int | None = Field(
        None, ge=1, description="--max-running-requests; null = SGLang's default (from KV size; 48 with speculative)."
    )
    cuda_graph_max_bs: int | None = Field(
        None, ge=1, description="--cuda-graph-max-bs-decode: largest decode batch replayed as a CUDA graph (larger "
        "ones run eagerly, slower); null = SGLang's default (80-160 GB GPUs: 512 at tp >= 4, else 256)."
    )
    mem_fraction_static: float | None = Field(
        None, gt=0, lt=1, description="--mem-fraction-static of this group (weights + KV share of GPU memory); "
        "null = engine.sglang.mem_fraction_static, else SGLang's own estimate."
    )
    max_total_tokens: int | None = Field(
        None, ge=1, description="--max-total-tokens of this group (KV pool cap, tokens); null = "
        "engine.sglang.max_total_tokens, else the pool mem_fraction_static leaves."
    )
    chunked_prefill_size: int | None = Field(
        None, ge=512, description="--chunked-prefill-size (prompt tokens per prefill forward); null = SGLang's "
        "default (8192 on 60-160 GB GPUs)."
    )
    attention_backend: str | None = Field(
        None, description=f"--attention-backend of this group, one of {MLA_ATTENTION_BACKENDS}; "
        "null = engine.sglang.attention_backend, else SGLang's default (fa3 on Hopper)."
    )
    disable_cuda_graph: bool = Field(False, description="--disable-cuda-graph: every decode step runs eagerly.")
    disable_prefill_cuda_graph: bool = Field(False, description="--disable-prefill-cuda-graph (SGLang >= 0.5).")
    enable_two_batch_overlap: bool = Field(False, description="--enable-two-batch-overlap (cost model: not modelled).")
    speculative: SpeculativeConfig | None = Field(None, description="Speculative decoding with the model's MTP layer; null = off.")
    extra_args: list[str] = Field(default_factory=list, description="Extra SGLang flags (not those of typed fields).")

    @model_validator(mode="after")
    def _parallel_shape(self) -> "WorkerGroup":
        if self.dp_attention and (self.dp < 2 or self.tp % self.dp):
            raise ValueError(
                f"dp_attention needs dp >= 2 dividing tp (tp={self.tp}, dp={self.dp}); set dp to a divisor of tp"
            )
        if self.ep not in (1, self.tp):
            raise ValueError(f"ep={self.ep}: SGLang needs ep_size x moe_dp_size = tp_size, so ep is 1 or tp={self.tp}")
        if self.moe_a2a_backend == "deepep" and (self.ep != self.tp or self.tp < 2):
            raise ValueError(f"moe_a2a_backend=deepep needs ep = tp > 1 (tp={self.tp}, ep={self.ep}); set ep: {self.tp}")
        if self.attention_backend is not None and self.attention_backend not in MLA_ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend={self.attention_backend!r} is not an MLA backend; allowed: {list(MLA_ATTENTION_BACKENDS)}"
            )
        return self

    @property
    def parallel(self) -> Parallelism:
        """This group's parallel shape as its servers' ServerSpec holds it (GPUs per server and per node)."""
        return Parallelism(self.tp, self.pp, self.dp, self.ep, self.dp_attention, self.nnodes, self.moe_a2a_backend)

    @property
    def gpus_per_server(self) -> int:  # GPUs of one server (Parallelism.gpus)
        return self.parallel.gpus

    @property
    def gpus_per_node(self) -> int:  # its GPUs on each of its nodes
        return self.parallel.gpus_per_node


class LayoutConfig(Strict):
    mode: Literal["pd", "aggregated"] = "pd"
    prefill: list[WorkerGroup] = Field(default_factory=list)
    decode: list[WorkerGroup] = Field(default_factory=list)
    aggregated: list[WorkerGroup] = Field(default_factory=list)

    @model_validator(mode="after")
    def _groups_match_mode(self) -> "LayoutConfig":
        if self.mode == "pd":
            if not self.prefill or not self.decode:
                raise ValueError("layout.mode=pd needs at least one group in layout.prefill and in layout.decode")
            if self.aggregated:
                raise ValueError("layout.aggregated must be empty when layout.mode=pd")
        else:
            if not self.aggregated:
                raise ValueError("layout.mode=aggregated needs at least one group in layout.aggregated")
            if self.prefill or self.decode:
                raise ValueError("layout.prefill/decode must be empty when layout.mode=aggregated")
        return self

    def groups(self) -> list[tuple[Role, int, WorkerGroup]]:
        """(role, index, group) for every group, roles 'prefill', 'decode' or 'aggregated'."""
        out: list[tuple[Role, int, WorkerGroup]] = []
        for role in ("prefill", "decode", "aggregated"):
            for i, g in enumerate(getattr(self, role)):
                out.append((role, i, g))
        return out

    def describe(self) -> str:
        def part(gs: list[WorkerGroup], tag: str) -> str:
            return "+".join(
                f"{g.count}{tag}xTP{g.tp}" + (f"PP{g.pp}" if g.pp > 1 else "")
                + (f"DP{g.dp}" + ("-attn" if g.dp_attention else "") if g.dp > 1 else "")
                for g in gs
            )

        if self.mode == "aggregated":
            return "agg:" + part(self.aggregated, "A")
        return part(self.prefill, "P") + "/" + part(self.decode, "D")
