"""SimSettings: one simulated server = its ServerSpec (the SGLang flags, parsed as the real server gets them) plus
the simulator's own knobs (where it listens, GPU profile, time scale, KV transfer, faults); the command line that
writes and reads them (add_server_args / settings_from_args, as SGLang's ServerArgs); and its cost model."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.model_presets import MODEL_PRESETS, ModelArchitecture
from orchestrator.config.server_spec import MODE_OF_ROLE, PdTimeouts, ServerSpec, add_spec_args, spec_from_args
from orchestrator.engines.sim.kv.transfer import MIB
from orchestrator.perfmodel.costmodel import EngineCostModel, build_cost_model
from orchestrator.perfmodel.gpus import GPU_SPECS
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


def add_server_args(p: argparse.ArgumentParser) -> None:
    """Flags: the ServerSpec's (SGLang's names, parsed as SGLang gets them), SGLang's launch flags, sim-only ones."""
    add_spec_args(p)
    g = p.add_argument_group("SGLang launch flags")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=30000)
    g.add_argument("--disaggregation-bootstrap-port", dest="bootstrap_port", type=int, default=8998)
    g.add_argument("--model-path", default=None, help="model directory with config.json (and tokenizer.json)")
    g.add_argument("--served-model-name", default=None)
    g.add_argument("--context-length", type=int, default=None)
    g.add_argument("--quantization", default="fp8", help="weight format: bf16, fp8, w4a8, awq")
    g.add_argument("--incremental-streaming-output", action="store_true")
    for flag in ("--enable-metrics", "--trust-remote-code", "--skip-server-warmup"):
        g.add_argument(flag, action="store_true", help="accepted for compatibility")
    for flag in ("--node-rank", "--dist-init-addr", "--base-gpu-id"):
        g.add_argument(flag, default=None, help="accepted for compatibility")
    s = p.add_argument_group("simulator flags")
    s.add_argument("--model-preset", default=None, help=f"architecture preset: {sorted(MODEL_PRESETS)}")
    s.add_argument("--profile", default="H100-SXM", choices=sorted(GPU_SPECS), help="cost-model GPU profile")
    s.add_argument("--gpu-memory-gb", type=float, default=None)
    s.add_argument("--efficiency-prefill", type=float, default=0.45)
    s.add_argument("--efficiency-decode", type=float, default=0.8)
    s.add_argument("--time-scale", type=float, default=1.0, help="multiply every simulated duration")
    s.add_argument("--startup-s", type=float, default=None, help="start-up delay; default cost model x time scale")
    s.add_argument("--faults", default=None, help="fault spec JSON, see docs/simulator.md")
    s.add_argument("--kv-transfer", choices=["auto", "nixl", "http"], default="auto")
    s.add_argument("--kv-buffer-mb", type=int, default=64, help="decode receive buffer (MiB), 8 MiB per transfer")
    s.add_argument("--kv-verify", choices=["full", "sampled"], default="full",
                   help="decode checks every received KV byte, or 64 bytes of every 4 KiB")
    s.add_argument("--kv-payload", choices=["sample", "full"], default="sample",
                   help="per request, move and verify the first --kv-sample-bytes of its KV (sample) or all of it "
                        "(full); the modelled transfer time is always the whole KV's")
    s.add_argument("--kv-sample-bytes", type=int, default=1 * MIB, help="bytes moved per request with --kv-payload sample")
    s.add_argument("--sim-node", default=None, help="node identity for same-node transfers; default --host")
    s.add_argument("--log-level", default="info")


def settings_from_args(a: argparse.Namespace) -> SimSettings:
    preset = a.model_preset or (None if a.model_path else "DeepSeek-R1")
    for name in ("kv_buffer_mb", "kv_sample_bytes"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(a, name)}: must be >= 1")
    if a.time_scale <= 0:
        raise ValueError(f"--time-scale={a.time_scale}: must be > 0")
    return SimSettings(
        spec=spec_from_args(a),
        host=a.host,
        port=a.port,
        bootstrap_port=a.bootstrap_port,
        model_preset=preset,
        model_path=a.model_path,
        served_model_name=a.served_model_name or preset or os.path.basename(os.path.normpath(a.model_path)),
        quantization=a.quantization,
        profile=a.profile,
        gpu_memory_gb=a.gpu_memory_gb,
        context_length=a.context_length,
        efficiency_prefill=a.efficiency_prefill,
        efficiency_decode=a.efficiency_decode,
        time_scale=a.time_scale,
        startup_s=a.startup_s,
        faults=a.faults,
        kv_transfer=a.kv_transfer,
        kv_buffer_mb=a.kv_buffer_mb,
        kv_verify=a.kv_verify,
        kv_payload=a.kv_payload,
        kv_sample_bytes=a.kv_sample_bytes,
        node=a.sim_node or a.host,
        incremental_streaming_output=a.incremental_streaming_output,
    )


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
