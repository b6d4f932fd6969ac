"""SimSettings: every knob of one simulated server (mode, profile, model, timeouts), and its cost model."""

from __future__ import annotations

import os
from dataclasses import dataclass

from orchestrator.config.model_presets import MODEL_PRESETS, ModelArchitecture
from orchestrator.engines.base import PdTimeouts
from orchestrator.perfmodel.costmodel import EngineCostModel, build_cost_model


@dataclass(frozen=True)
class SimSettings:
    """Everything one simulated server needs, from its command line."""

    host: str
    port: int
    mode: str  # null | prefill | decode
    bootstrap_port: int
    model_preset: str | None
    model_path: str | None
    served_model_name: str
    quantization: str
    profile: str
    gpu_memory_gb: float | None
    tp: int
    pp: int
    dp: int
    ep: int
    dp_attention: bool
    nnodes: int
    max_running_requests: int | None
    chunked_prefill_size: int | None
    mem_fraction_static: float | None
    context_length: int | None
    efficiency_prefill: float
    efficiency_decode: float
    time_scale: float
    startup_s: float | None
    faults: str | None
    kv_transfer: str
    kv_buffer_mb: int
    kv_verify: str
    kv_payload: str  # sample | full: the KV bytes that really move per request (the model charges all of them)
    kv_sample_bytes: int
    node: str
    incremental_streaming_output: bool
    timeouts: PdTimeouts
    page_size: int = 1
    cuda_graph_max_bs: int | None = None
    attention_backend: str | None = None
    cuda_graph: bool = True  # False: --disable-cuda-graph
    prefill_graphs: bool = True  # False: --disable-prefill-cuda-graph
    sglang_version: str = "0.5.17"  # whose defaults the cost model takes for unset flags
    load_format: str | None = None  # --load-format: dummy weights change the experts a decode step reads

    @property
    def engine_type(self) -> str:
        return {"null": "unified"}.get(self.mode, self.mode)

    @property
    def role(self) -> str:
        return {"null": "aggregated"}.get(self.mode, self.mode)


def architecture_of(settings: SimSettings) -> ModelArchitecture:
    if settings.model_preset:
        if settings.model_preset not in MODEL_PRESETS:
            raise ValueError(f"--model-preset={settings.model_preset!r}; allowed: {sorted(MODEL_PRESETS)}")
        return MODEL_PRESETS[settings.model_preset]
    if not settings.model_path:
        raise ValueError("set --model-preset NAME or --model-path DIR (a directory with config.json)")
    path = os.path.join(settings.model_path, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"--model-path={settings.model_path!r} has no config.json; point it at a model directory")
    return ModelArchitecture.from_hf_config(path)  # type: ignore[arg-type]


def cost_model_of(settings: SimSettings, arch: ModelArchitecture) -> EngineCostModel:
    """The server's cost model, built as the planner builds one (perfmodel/costmodel.py build_cost_model)."""
    return build_cost_model(
        arch,
        settings.profile,
        settings.quantization,
        gpu_memory_gb=settings.gpu_memory_gb,
        tp=settings.tp,
        pp=settings.pp,
        dp=settings.dp,
        ep=settings.ep,
        efficiency_prefill=settings.efficiency_prefill,
        efficiency_decode=settings.efficiency_decode,
        max_running_requests=settings.max_running_requests,
        dp_attention=settings.dp_attention,
        nnodes=settings.nnodes,
        role=settings.role,
        context_length=settings.context_length,
        mem_fraction_static=settings.mem_fraction_static,  # None: SGLang's default, as the planner derives it
        chunked_prefill_tokens=settings.chunked_prefill_size or None,
        page_size=settings.page_size,
        cuda_graph_max_bs=settings.cuda_graph_max_bs,
        attention_backend=settings.attention_backend,
        cuda_graph=settings.cuda_graph,
        prefill_graphs=settings.prefill_graphs,
        sglang_version=settings.sglang_version,
        load_format=settings.load_format,
    )
