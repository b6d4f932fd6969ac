"""The settings of one engine server and the parallel shape they give it (ServerShape: EngineCostModel's fields,
declared once)."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.config.model_presets import ModelArchitecture
from orchestrator.perfmodel.calibration import Calibration
from orchestrator.perfmodel.gpus import GpuSpec
from orchestrator.perfmodel.speculative import Speculative
from orchestrator.perfmodel.weights import ParamCounts, WeightFormat
from orchestrator.records import Role


@dataclass
class ServerShape:
    """The settings of one server and the shape they give it (EngineCostModel's fields, declared once here)."""

    arch: ModelArchitecture
    gpu: GpuSpec
    tp: int = 1
    dp: int = 1
    ep: int = 1
    quantization: str = "fp8"
    efficiency_prefill: float = 0.45
    efficiency_decode: float = 0.8  # server/forward.WEIGHT_READ_EFFICIENCY: the rate the GPUs' fixed costs were split against
    mem_fraction_static: float | None = None  # None: SGLang's default for this GPU, TP and role
    max_running_requests: int | None = None  # None: SGLang's default from the KV pool (never unlimited)
    dp_attention: bool = False
    pp: int = 1
    nnodes: int = 1
    role: Role = "aggregated"
    kv_dtype_bytes: int = 2  # SGLang's kv_cache_dtype=auto keeps the latent in bf16
    chunked_prefill_tokens: int | None = None  # None: SGLang's default --chunked-prefill-size
    context_length: int | None = None
    # share of the GpuSpec link rates a collective reaches, for a GPU without published figures (collectives.link_figures:
    # H100 / H200 take the nccl-tests figures themselves, ring all-reduce busbw 368 of NVLink's 450 GB/s, NVIDIA/nccl
    # issue 1455 and nccl-tests issue 212); the KV path has its own, measured (server/kv_transfer.KV_NVLINK_SHARE)
    comm_efficiency: float = 0.8
    sglang_version: str = "0.5.17"
    cuda_graph_max_bs: int | None = None  # --cuda-graph-max-bs; None: SGLang's default for GPU and TP
    cuda_graph: bool = True  # decode CUDA graphs (False: --disable-cuda-graph)
    prefill_graphs: bool = True  # False: --disable-prefill-cuda-graph
    page_size: int = 1
    attention_backend: str | None = None  # None: SGLang's pick (FA3/flashinfer on Hopper)
    triton_split_tile_size: int | None = None  # --triton-attention-split-tile-size (None: SGLang's split count)
    max_total_tokens: int | None = None  # --max-total-tokens: cap of each scheduler's KV pool
    speculative: Speculative | None = None  # MTP: R1's draft layer (memory, KV, draft + verify steps)
    load_format: str | None = None  # dummy: every token routes to the same experts (weights.experts_hit_fraction)
    calibration: Calibration | None = None  # from a shipped profile of this GPU and layer shape
    format: WeightFormat = field(init=False, repr=False)
    params: ParamCounts = field(init=False, repr=False)
    defaults_used: list[str] = field(init=False, repr=False)

    # --- shape -----------------------------------------------------------------------------------
    @property
    def attn_dp(self) -> int:
        """Attention data-parallel ranks inside one TP group (DP attention)."""
        return self.dp if self.dp_attention else 1

    @property
    def replicas(self) -> int:
        """Independent model copies inside the server (plain --dp-size without DP attention)."""
        return 1 if self.dp_attention else self.dp

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.replicas

    @property
    def gpus_per_node(self) -> int:
        return -(-self.gpus // self.nnodes)

    @property
    def _tp_spans_nodes(self) -> bool:
        return self.nnodes > 1 and self.pp == 1 and self.tp > self.gpus_per_node
