"""SimSettings: one simulated server = its ServerSpec (the SGLang flags, parsed as the real server gets them) plus
the simulator's own knobs (where it listens, GPU profile, time scale, KV transfer, faults); and its cost model."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.model_presets import MODEL_PRESETS, ModelArchitecture
from orchestrator.config.server_spec import MODE_OF_ROLE, PdTimeouts, ServerSpec
from orchestrator.perfmodel.costmodel import EngineCostModel, build_cost_model
from orchestrator.records import Role


@dataclass(frozen=True)
class SimSettings:
    """Everything one simulated server needs, from its command line."""

    spec: ServerSpec
    host: str
    port: int
    bootstrap_port: int
    model_preset: str | None
    model_path: str | None
    served_model_name: str
    quantization: str
    profile: str
    gpu_memory_gb: float | None
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

    @property
    def role(self) -> Role:
        return self.spec.role

    @property
    def mode(self) -> str:
        """--disaggregation-mode: null | prefill | decode."""
        return MODE_OF_ROLE[self.spec.role]

    @property
    def engine_type(self) -> str:
        return {"aggregated": "unified"}.get(self.role, self.role)

    @property
    def timeouts(self) -> PdTimeouts:
        return self.spec.pd.timeouts


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
    return ModelArchitecture.from_hf_config(Path(path))


def cost_model_of(settings: SimSettings, arch: ModelArchitecture) -> EngineCostModel:
    """The server's cost model, built from its ServerSpec as the planner builds one (perfmodel/costmodel.py)."""
    return build_cost_model(
        arch, settings.profile, settings.quantization, gpu_memory_gb=settings.gpu_memory_gb, spec=settings.spec,
        efficiency_prefill=settings.efficiency_prefill, efficiency_decode=settings.efficiency_decode,
        context_length=settings.context_length,
    )
