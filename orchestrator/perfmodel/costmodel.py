"""GPU cost model of one SGLang engine server: weights, KV capacity, step times, transfers, start-up.

config (RunConfig group) -> EngineCostModel -> seconds and bytes, used by the simulated engine and the planner.

Every time is a roofline: max(FLOPs / (peak x efficiency), bytes / (HBM x efficiency)) plus collective
and fixed per-step costs. Units: GB = 1e9 bytes, TB/s = 1e12 B/s, TFLOPs = 1e12 FLOP/s.

Sources of the constants (dense peak, per GPU):
- H100-SXM 80 GB: 989 TFLOPs BF16, 1979 TFLOPs FP8 (dense, i.e. without the 2:4 sparsity factor),
  3.35 TB/s HBM3 -- NVIDIA H100 Tensor Core GPU datasheet.
- H200 141 GB: same Hopper compute as H100-SXM, 4.8 TB/s HBM3e -- NVIDIA H200 datasheet.
- NVLink 4: 900 GB/s bidirectional per GPU = 450 GB/s per direction -- Hopper datasheets.
- InfiniBand NDR: 400 Gb/s = 50 GB/s per GPU (one ConnectX-7 per GPU in DGX/HGX H100) -- NVIDIA DGX
  H100 user guide.
- `memory_gb` is the datasheet capacity, which the driver reports in GiB (H100: 81559 MiB ~ 80 GiB,
  H200: 143771 MiB ~ 140.4 GiB), so capacity in bytes = memory_gb x 2^30.

Assumptions and measured terms of the roofline (docs/planning.md):
- Efficiencies: 45 % of peak FLOPs in prefill GEMMs where no profile measured it (config.engine.sim); reads at 80 %
  of HBM (server/forward.WEIGHT_READ_EFFICIENCY, the rate the fixed costs were split against), routed experts at the
  fused-MoE kernel's measured 88 % (gpus.GpuSpec.routed_read_share, expert_stream_share).
- Fixed cost per forward, measured: the GPU's CUDA-graphed decode floor, 0.64 ms (H100) / 1.15 ms (H200) per step +
  44 us per layer, split from the shipped one-GPU profiles at two layer counts (graphed_step_floor; the R1-shaped
  layer its own, 0.18 / 0.57 ms + 139.5 us per layer, from 4-6 layers on one H100: shape_step_floor; held by
  tests/perfmodel/test_fixed_costs_trace.py). It prices every roofline forward (a TP group across nodes, a shape or
  format no profile measured, every prefill forward) and is subtracted from each calibration prefill forward before
  its share of peak is fitted (_prefill_fit); a TP layer across nodes adds 128 us (cited: parallel/collectives.py).
- Tensor parallel: two all-reduces per layer (after attention and after the MLP/MoE), bf16 activations, at
  the published NCCL figures inside a node or across two (perfmodel/parallel/collectives.py, each cited there;
  a forward outside a CUDA graph pays the eager floor measured on two H200s).
- MLA: the compressed KV latent (kv_lora_rank + rope dims per layer) is replicated on every attention-TP
  rank, so TP does not multiply KV capacity; DP attention does (each rank holds its own requests).
- MoE: routed experts are sharded over all TP ranks (by EP or by TP, the bytes per GPU are the same).
  A decode step reads only the experts its batch hits: E x (1 - (1 - k/E)^tokens) (uniform routing) with real
  weights; with dummy weights under R1's router the distinct experts measured on one H200 (weights.dummy_routing);
  on dummy weights the greedy requests whose prompts end in the same token (a closed loop's chat requests) decode one
  2-token cycle, so a decode step routes at most two tokens per such chain (weights.decode_routing_tokens: the step
  loop passes each request's chain, perfmodel/scheduling/steps.py).
- Pipeline parallel (a group's `pp`) splits layers over stages that pp micro-batches keep busy,
  one activation send per stage boundary (perfmodel/parallel/pipeline.py); collectives are published NCCL
  figures (perfmodel/parallel/collectives.py).
- Weight formats: bf16 = 2 B; fp8 = 1 B + one fp32 scale per 128x128 block; w4a8 = int4 routed
  experts + one fp32 scale per 128 weights, attention/dense/shared experts kept at fp8; awq = int4 for
  every linear layer + fp16 scale and int4 zero per 128 weights, GEMMs in bf16. Embedding and lm_head
  stay bf16 in every format.
- Start-up: process + NCCL init, weight load (dummy = generated on GPU; real = the whole checkpoint read
  from disk on each node at `disk_gb_s`), KV allocation, decode CUDA-graph capture (not on a PD prefill
  server: SGLang disables it there) per batch size and layer, and with cold caches the first size's compile
  once (the kernels the later sizes reuse; a server without decode graphs pays it at its first forward), a rest
  per further size, plus first-forward JIT (measured: docs/fidelity.md).

Unset SGLang flags take SGLang's own defaults (perfmodel/sglang_defaults.py); a shipped calibration profile
for the GPU and layer shape replaces the assumptions above where it measured them (perfmodel/calibration.py).
This module builds the model from a config or a ServerSpec; the model is server/engine_cost_model.py's EngineCostModel
(its terms: server/*.py, weights.py, speculative.py), its calibration calibration_lookup.py's.
"""


from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from orchestrator.config.model_presets import ModelArchitecture
from orchestrator.config.server_spec import ServerSpec, server_spec
from orchestrator.perfmodel.calibration_lookup import find_calibration
from orchestrator.perfmodel.gpus import gpu_spec
from orchestrator.perfmodel.server.engine_cost_model import EngineCostModel
from orchestrator.perfmodel.speculative import Speculative, mtp_accept_length
from orchestrator.records import Role

if TYPE_CHECKING:
    from orchestrator.config import RunConfig, WorkerGroup

__all__ = [  # EngineCostModel: the model these build, imported from here by its users
    "EngineCostModel", "build_cost_model", "cost_model_for", "cost_model_of_spec", "spec_fields",
]


def build_cost_model(
    arch: ModelArchitecture,
    gpu: str,
    quantization: str,
    gpu_memory_gb: float | None = None,
    calibrated: bool = True,
    spec: ServerSpec | None = None,
    **server: Any,
) -> EngineCostModel:
    """The one constructor of a server's cost model: the GPU by name (`gpu_memory_gb` overrides its memory),
    the shipped calibration for that GPU and layer shape unless `calibrated` is False (never for cpu-fast),
    the server's settings from `spec` (a ServerSpec: the planner's from a config, the simulated server's from
    its command line; unset flags take SGLang's defaults) and `server`'s other EngineCostModel fields.

    cost_model_for (a config's group) and engines/sim/settings.py (a simulated server) build through it, as do the calibration fits (their profile's own server)."""
    if spec is not None:
        server = {**spec_fields(spec), **server}
    hardware = gpu_spec(gpu, gpu_memory_gb)
    load_format = server.get("load_format")
    tp, dp = server.get("tp") or 1, server.get("dp") or 1
    attention_tp = tp // dp if server.get("dp_attention") and dp > 1 else tp
    calibration = (find_calibration(hardware.name, arch, quantization, load_format=load_format,
                                    attention_tp=attention_tp, ep=server.get("ep") or 1)
                   if calibrated and gpu != "cpu-fast" else None)
    return EngineCostModel(arch=arch, gpu=hardware, quantization=quantization, calibration=calibration, **server)



def cost_model_for(
    cfg: RunConfig,
    role: Role,
    group: WorkerGroup,
    gpu: str | None = None,
    sglang_version: str | None = None,
    calibrated: bool = True,
) -> EngineCostModel:
    """The cost model of one server of `group`; GPU = `gpu`, else the sim profile (sim) or cluster.gpu.

    The server is its ServerSpec (config/server_spec.py); unset SGLang flags take the defaults of `sglang_version`
    (default: engine.sglang.version); `calibrated` loads the shipped calibration profile for this GPU and layer
    shape (the same shape on another GPU if none)."""
    spec = server_spec(cfg, role, group)
    if sglang_version is not None:
        spec = replace(spec, sglang_version=sglang_version)
    return cost_model_of_spec(cfg, spec, gpu, calibrated)


def cost_model_of_spec(cfg: RunConfig, spec: ServerSpec, gpu: str | None = None, calibrated: bool = True) -> EngineCostModel:
    """The cost model of the server `spec` describes (its settings, none re-read from the config), on `gpu` (else
    the sim profile or cluster.gpu), with the config's model and efficiencies."""
    if gpu is None:
        gpu = cfg.sim_profile if cfg.engine.kind == "sim" else cfg.cluster.gpu
    return build_cost_model(
        cfg.model.architecture(), gpu, cfg.model.quantization,
        gpu_memory_gb=cfg.cluster.gpu_memory_gb if gpu == cfg.cluster.gpu else None, calibrated=calibrated, spec=spec,
        efficiency_prefill=cfg.engine.sim.efficiency_prefill, efficiency_decode=cfg.engine.sim.efficiency_decode,
        context_length=cfg.model.context_length,
    )


def spec_fields(spec: ServerSpec) -> dict[str, Any]:
    """The EngineCostModel fields a ServerSpec sets (the rest are assumptions: efficiencies, context length)."""
    draft = spec.speculative
    speculative = None
    if draft.algorithm is not None and draft.num_steps and draft.num_draft_tokens:
        accept = draft.accept_length or mtp_accept_length(
            draft.num_steps, draft.num_draft_tokens, dummy_weights=spec.load_format == "dummy"
        )
        speculative = Speculative(draft.num_steps, draft.num_draft_tokens, min(accept, float(draft.num_draft_tokens)))
    p, m, b = spec.parallel, spec.memory, spec.batching
    return dict(
        tp=p.tp, dp=p.dp, ep=p.ep, pp=p.pp, dp_attention=p.dp_attention, nnodes=p.nnodes, role=spec.role,
        mem_fraction_static=m.mem_fraction_static, page_size=m.page_size, kv_dtype_bytes=m.kv_dtype_bytes,
        max_running_requests=b.max_running_requests, chunked_prefill_tokens=b.chunked_prefill_size,
        cuda_graph_max_bs=b.cuda_graph_max_bs, cuda_graph=not b.disable_cuda_graph,
        prefill_graphs=not b.disable_prefill_cuda_graph,
        sglang_version=spec.sglang_version, attention_backend=spec.attention_backend, speculative=speculative,
        load_format=spec.load_format, max_total_tokens=m.max_total_tokens,
        triton_split_tile_size=spec.triton_split_tile_size,
    )
