"""Calibration profile: what real SGLang runs measured for one GPU, one model shape and one SGLang version.

A profile is a JSON file under orchestrator/perfmodel/profiles/ (one per GPU x model shape x SGLang
version x flags that matter), written by `pd-orchestrator calibrate` from its raw files under
benchmarks/results/<date>-calibration-<slug>/, and loaded by the cost model (planner and simulator) for
the matching GPU and model shape. Every figure says where it comes from:

- measured figures (decode / prefill / transfer points, start-up runs, memory outcomes) are what the
  harness saw on the GPU named in `gpu`, under the flags in `engine`; `raw` names their raw files;
- published figures (`links`: NVLink, InfiniBand, all-reduce / all-to-all rates a single GPU cannot
  show) are labelled `source: published` and cite where they come from.

File -> CalibrationProfile (pydantic, unknown keys refused) -> cost model (fits in calibration.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SCHEMA_VERSION = 1
PROFILES_DIR = Path(__file__).with_name("profiles")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProfileGpu(_Strict):
    """The GPU the figures were measured on."""

    name: str = Field(description="cost-model GPU key, e.g. 'H200' or 'H100-SXM' (orchestrator/perfmodel/gpus.py)")
    device_name: str = Field(description="what nvidia-smi printed, e.g. 'NVIDIA H200'")
    memory_mib: int = Field(gt=0, description="total memory as the driver reports it (nvidia-smi memory.total)")
    count: int = Field(1, ge=1, description="GPUs the measured server used")
    machine: str = Field("", description="machine kind it ran on, e.g. 'nvidia-h200' (device tool kind)")


class ProfileModel(_Strict):
    """The model shape: per-layer dimensions decide per-layer cost; layers may differ from the target."""

    name: str = Field(description="e.g. 'r1-shaped-6L' or 'deepseek-v2-lite'")
    hidden_size: int
    num_hidden_layers: int
    first_k_dense_replace: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    num_attention_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    quantization: Literal["bf16", "fp8", "w4a8", "awq"]
    load_format: str = "dummy"
    routing: Literal["as-loaded", "random-gates"] = Field(
        "as-loaded", description="random-gates: every MoE gate re-drawn after the dummy load (real-like, uniform "
        "routing: the profile real-weight servers take); as-loaded: the weights' own routing (dummy weights: every "
        "token to nearly the same experts)")

    @property
    def real_like(self) -> bool:
        """Does this profile's routing stand for a real checkpoint's (random gates, or real weights)?"""
        return self.routing == "random-gates" or self.load_format != "dummy"

    def layer_shape(self) -> tuple:
        """Everything but the layer count: two models with the same layer shape share per-layer costs."""
        return (
            self.hidden_size, self.n_routed_experts, self.num_experts_per_tok, self.moe_intermediate_size,
            self.num_attention_heads, self.kv_lora_rank, self.qk_rope_head_dim, self.quantization,
        )

    def matches(self, arch: object, quantization: str) -> bool:
        """True when `arch` (a ModelArchitecture) has this per-layer shape in this weight format."""
        other = (
            getattr(arch, "hidden_size", None), getattr(arch, "n_routed_experts", None),
            getattr(arch, "num_experts_per_tok", None), getattr(arch, "moe_intermediate_size", None),
            getattr(arch, "num_attention_heads", None), getattr(arch, "kv_lora_rank", None),
            getattr(arch, "qk_rope_head_dim", None), quantization,
        )
        return other == self.layer_shape()


class EngineSettings(_Strict):
    """The SGLang version and the flags that change the figures; None = SGLang's own default was used."""

    sglang_version: str = Field(description="e.g. '0.5.17'")
    attention_backend: str = Field(description="e.g. 'triton' (FA3 is stripped from the carried kernel)")
    sampling_backend: str = "pytorch"
    tp: int = 1
    dp: int = 1
    dp_attention: bool = False
    ep: int = 1
    page_size: int = 1
    kv_cache_dtype: str = "auto"
    context_length: int | None = None
    mem_fraction_static: float | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    max_running_requests: int | None = None
    disaggregation_mode: Literal["null", "prefill", "decode"] = "null"
    extra_args: list[str] = Field(default_factory=list, description="any other flag passed, verbatim")
    # what the server reported about itself (server log / /server_info), not what we asked for
    reported_max_total_num_tokens: int | None = None
    reported_max_running_requests: int | None = None
    reported_chunked_prefill_size: int | None = None
    reported_cuda_graph_batch_sizes: list[int] | None = None

    @field_validator("mem_fraction_static")
    @classmethod
    def _fraction(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v < 1:
            raise ValueError(f"must be in (0, 1), got {v}")
        return v


class DecodePoint(_Strict):
    """One decode step (or the mean of several) at a running batch size and total context."""

    batch_size: int = Field(ge=1)
    context_tokens: int = Field(ge=0, description="KV tokens the batch attends over, summed over its requests")
    step_s: float = Field(gt=0, description="seconds per decode step")
    cuda_graph: bool = Field(description="the step replayed a captured CUDA graph (False: eager, batch above the largest captured size)")
    steps: int = Field(1, ge=1, description="decode steps averaged into step_s")


class PrefillPoint(_Strict):
    """One prefill forward: `new_tokens` computed for `requests` requests on top of `cached_tokens`."""

    new_tokens: int = Field(ge=1)
    requests: int = Field(1, ge=1)
    cached_tokens: int = Field(0, ge=0)
    time_s: float = Field(gt=0)
    per_request: list[list[int]] | None = Field(
        None, description="[new, cached] tokens of each request of the batch (else split evenly)")
    source: Literal["client", "server-log"] = Field(
        "client", description="client: a request's latency (max_new_tokens 1); server-log: the gap between two "
        "SGLang prefill lines (perfmodel/prefill_log.py)")

    def requests_split(self) -> tuple[list[int], list[int]]:
        """(new tokens, cached tokens) per request."""
        if self.per_request:
            return [n for n, _ in self.per_request], [c for _, c in self.per_request]
        per = self.new_tokens // self.requests
        new = [per] * self.requests
        new[-1] += self.new_tokens - per * self.requests
        return new, [self.cached_tokens // self.requests] * self.requests


class TransferPoint(_Strict):
    """KV of one request moved prefill -> decode (PD), as SGLang's kv_transfer metrics report it."""

    tokens: int = Field(ge=1)
    page_size: int = Field(ge=1)
    bytes: int = Field(ge=1)
    time_s: float = Field(gt=0, description="transfer latency (SGLang's sglang:kv_transfer_latency)")
    bootstrap_s: float | None = Field(None, description="bootstrap / handshake time before the transfer")
    link: str = Field("same-gpu", description="'same-gpu', 'nvlink', 'ib'")


class StartupRun(_Strict):
    """One server start: launch -> ready, by phase where the server reported it (None: not seen)."""

    caches: Literal["cold", "warm"] = Field(description="cold: fresh machine, empty Triton/DeepGEMM/JIT caches")
    role: Literal["aggregated", "prefill", "decode"] = "aggregated"
    ready_s: float | None = Field(None, gt=0, description="launch to /health answering (None: not observed)")
    process_s: float | None = Field(None, description="launch to the scheduler's model load begin (imports, args, NCCL)")
    weights_s: float | None = None
    kv_alloc_s: float | None = None
    graph_capture_s: float | None = Field(None, description="decode CUDA-graph capture, all batch sizes")
    graph_batch_sizes: int | None = Field(None, description="how many batch sizes were captured")
    first_graph_capture_s: float | None = Field(
        None, gt=0, description="capture of the first (largest) batch size alone, from SGLang's progress bar: with "
        "empty caches it holds the compile of every kernel the later sizes reuse")
    tokenizer_s: float | None = Field(None, description="SGLang's startup_time.tokenizer_e2e")
    first_request_s: float | None = Field(None, description="first request after ready (JIT of new shapes)")


class MemoryOutcome(_Strict):
    """Did a setting run or die of OOM under a given load (the activation headroom figure)."""

    mem_fraction_static: float
    chunked_prefill_size: int
    cuda_graph_max_bs: int | None = None
    outcome: Literal["ran", "oom"]
    load: str = Field(description="what was sent, e.g. '512 requests of 256 in / 128 out at once'")
    free_after_init_gb: float | None = Field(None, description="GPU memory left after KV pool + graphs")
    weights_gb: float | None = None
    max_total_num_tokens: int | None = None


class PageSizeEffect(_Strict):
    """How much slower (or faster) a decode step is at another --page-size than at the profile's, measured."""

    page_size: int = Field(ge=1)
    decode_step_ratio: float = Field(gt=0, description="mean decode step at this page size / at the profile's page size")
    evidence: str = Field(description="what it was computed from (metric, runs)")


class RoutingPoint(_Strict):
    """How many distinct routed experts one MoE layer call touched at a decode batch, measured (eager server,
    every select_experts call traced: scripts/device/dummy_routing_probe.py)."""

    tokens: int = Field(ge=1, description="tokens of the call (the decode batch)")
    distinct_experts: float = Field(gt=0, description="mean distinct routed experts per MoE layer call")
    gate: Literal["dummy", "random"] = Field(description="dummy weights as loaded, or every MoE gate randomised")
    calls: int = Field(1, ge=1, description="MoE layer calls averaged")


class LinkFigure(_Strict):
    """A figure one GPU cannot measure: taken from a published source and labelled so."""

    name: str = Field(description="e.g. 'nvlink_gb_s', 'ib_gb_s', 'allreduce_bus_efficiency'")
    value: float
    unit: str
    source: Literal["published"] = "published"
    reference: str = Field(description="where it is published (datasheet, paper, URL)")


class CalibrationProfile(_Strict):
    """One profile file. `raw` points at the raw measurements it was written from."""

    schema_version: int = SCHEMA_VERSION
    name: str
    purpose: Literal["calibration", "layer-count"] = Field(
        "calibration", description="layer-count: a decode grid of a layer shape at one of several layer counts measured "
        "on one host, which only splits a graphed step's fixed time into per-step and per-layer parts "
        "(calibration_lookup.layer_count_split); never a server's calibration (find_profile skips it)")
    created: str = Field(description="UTC date-time of the measurement")
    command: str = Field(description="the command that produced the raw files")
    raw: str = Field(description="benchmarks/results/<date>-calibration-<slug>/ (relative to the repo root)")
    gpu: ProfileGpu
    model: ProfileModel
    engine: EngineSettings
    decode: list[DecodePoint] = Field(default_factory=list)
    prefill: list[PrefillPoint] = Field(default_factory=list)
    transfer: list[TransferPoint] = Field(default_factory=list)
    startup: list[StartupRun] = Field(default_factory=list)
    memory: list[MemoryOutcome] = Field(default_factory=list)
    page_size_effects: list[PageSizeEffect] = Field(default_factory=list)
    routing: list[RoutingPoint] = Field(default_factory=list)
    links: list[LinkFigure] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_schema(self) -> CalibrationProfile:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema_version {self.schema_version} is not {SCHEMA_VERSION}; re-run calibrate")
        return self

    def measured_decode(self, cuda_graph: bool | None = None) -> list[DecodePoint]:
        return [p for p in self.decode if cuda_graph is None or p.cuda_graph == cuda_graph]


class RoutingCurve(_Strict):
    """A layer shape's measured routing without a step profile of its own: the distinct routed experts a decode
    batch touched (scripts/device/qwen3_probe.sh's counts), shipped in profiles/routing/. A dummy-weight curve
    here decides what a dummy-weight step of that shape reads, whatever its router (docs/fidelity.md, the rule
    recorded before the Qwen3 probe ran)."""

    model: ProfileModel
    raw: str = Field(description="benchmarks/results/<date>-<slug>/ the counts were read from")
    command: str = Field(description="the command that produced the raw files")
    routing: list[RoutingPoint] = Field(min_length=1)


def shipped_routing_curves(directory: str | Path = PROFILES_DIR / "routing") -> list[RoutingCurve]:
    """Every routing curve shipped in `directory`; bad content -> ProfileError naming the file and field."""
    curves = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            curves.append(RoutingCurve.model_validate(json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError, ValidationError) as exc:
            raise ProfileError(f"{path}: not a routing curve ({str(exc).splitlines()[0]})") from None
    return curves


class CaptureStart(_Strict):
    """One warm server start of a layer-count probe: its decode CUDA-graph capture, all sizes."""

    layers: int = Field(ge=1)
    sizes: int = Field(ge=1, description="decode graph batch sizes captured")
    capture_s: float = Field(gt=0, description="SGLang's 'Capture ... CUDA graph end. elapsed=' of the start")


class CaptureLayerLaw(_Strict):
    """How a layer shape's warm decode-graph capture per size grows with the layer count, from warm starts of one host
    at several counts (a registered lease's kept starts, written by its read from the raw files): the least-squares
    line a + b L of capture per size. A profile of the shape keeps its own level at its own layer count; the line gives
    the form (calibration_lookup.with_capture_law)."""

    model: ProfileModel = Field(description="the layer shape (its num_hidden_layers: the probe's smallest count)")
    gpu: str = Field(description="cost-model GPU key of the host the starts ran on")
    raw: str = Field(description="benchmarks/results/<date>-<slug>/ the starts were read from")
    read: str = Field(description="benchmarks/results/<date>-<slug>/ of the registered read that adopted the form")
    command: str = Field(description="the command that wrote this file from the raw files")
    warm_starts: list[CaptureStart] = Field(min_length=2)

    @field_validator("warm_starts")
    @classmethod
    def _two_counts(cls, starts: list[CaptureStart]) -> list[CaptureStart]:
        if len({s.layers for s in starts}) < 2:
            raise ValueError("a line needs starts at two or more layer counts; add another count's warm starts")
        return starts

    def line(self) -> tuple[float, float]:
        """(a, b) of the least-squares capture per size a + b L over the warm starts."""
        points = [(s.layers, s.capture_s / s.sizes) for s in self.warm_starts]
        mean_x = sum(x for x, _ in points) / len(points)
        mean_y = sum(y for _, y in points) / len(points)
        b = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
        return mean_y - b * mean_x, b

    def fixed_share(self, reference_layers: int) -> float:
        """f: the part of a size's capture at `reference_layers` that does not grow with the layers, a / (a + b L_ref)."""
        a, b = self.line()
        return a / (a + b * reference_layers)

    def counts(self) -> tuple[int, int]:
        """The smallest and largest layer count measured."""
        layers = [s.layers for s in self.warm_starts]
        return min(layers), max(layers)


def shipped_capture_laws(directory: str | Path = PROFILES_DIR / "capture") -> list[CaptureLayerLaw]:
    """Every capture law shipped in `directory`; bad content -> ProfileError naming the file and field."""
    laws = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            laws.append(CaptureLayerLaw.model_validate(json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError) as exc:
            raise ProfileError(f"{path}: not a readable JSON capture law ({exc})") from None
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            raise ProfileError(f"{path}: {where}: {err['msg']}") from None
    return laws


class ProfileError(ValueError):
    """A profile file that cannot be used: the message names the file, the field and the fix."""


def load_profile(path: str | Path) -> CalibrationProfile:
    """Read one profile file; bad content -> ProfileError naming the file and the first bad field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{path}: not a readable JSON profile ({exc})") from None
    try:
        return CalibrationProfile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise ProfileError(f"{path}: {where}: {err['msg']}") from None


def shipped_profiles(directory: str | Path = PROFILES_DIR) -> list[CalibrationProfile]:
    """Every profile shipped in `directory`, sorted by file name."""
    return [load_profile(p) for p in sorted(Path(directory).glob("*.json"))]


def find_profile(
    gpu: str,
    arch: object,
    quantization: str,
    profiles: list[CalibrationProfile] | None = None,
    load_format: str | None = "dummy",
) -> CalibrationProfile | None:
    """The shipped profile for this GPU and this per-layer model shape, or None: the one whose routing stands for
    `load_format` (dummy weights: as loaded; a real checkpoint: random gates or real weights), then the newest
    SGLang version, then the newest measurement (a fresh calibration run beats one derived from older logs)."""
    candidates = [
        p for p in (profiles if profiles is not None else shipped_profiles())
        if p.gpu.name == gpu and p.model.matches(arch, quantization) and p.purpose == "calibration"
    ]
    real = load_format != "dummy"
    candidates.sort(
        key=lambda p: (p.model.real_like == real,
                       tuple(int(x) for x in p.engine.sglang_version.split(".") if x.isdigit()), p.created),
        reverse=True,
    )
    return candidates[0] if candidates else None
