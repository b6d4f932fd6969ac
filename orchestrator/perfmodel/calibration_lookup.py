"""Which calibration a server of a GPU and layer shape gets: its own shipped profile's fit, else what other profiles
lend it (the same shape on another GPU, start-up figures of this GPU, the dummy-weight routing curve of the shape, the
GPU's graphed step floor, the fused-MoE expert read share, prefill shares of peak).

shipped profiles (perfmodel/profile.py) -> fits (perfmodel/calibration.py) at the profile's own server -> Calibration
-> perfmodel/costmodel.py build_cost_model."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

import numpy as np

from orchestrator.config.model_presets import MODEL_PRESETS, ModelArchitecture
from orchestrator.config.server_spec import KV_DTYPE_BYTES
from orchestrator.perfmodel.calibration import (
    Calibration,
    fit_decode,
    PrefillShares,
    StartupCoeffs,
    fit_prefill_shares,
    fit_startup,
    runtime_overhead_gb,
)
from orchestrator.perfmodel.gpus import GB, gpu_spec
from orchestrator.perfmodel.profile import CalibrationProfile, ProfileModel, find_profile, shipped_capture_laws
from orchestrator.perfmodel.profile import shipped_profiles, shipped_routing_curves
from orchestrator.perfmodel.server.engine_cost_model import EngineCostModel
from orchestrator.perfmodel.shard import shard_stand_in
from orchestrator.perfmodel.weights import experts_hit_fraction


def _uncalibrated(arch: ModelArchitecture, gpu: str, quantization: str, **server: Any) -> EngineCostModel:
    """A profile's own server, priced without any calibration (what the fits subtract or compare against)."""
    return EngineCostModel(arch=arch, gpu=gpu_spec(gpu), quantization=quantization, calibration=None, **server)


def calibration_for(profile: CalibrationProfile, arch: ModelArchitecture, quantization: str) -> Calibration:
    """Fit a profile's points on its own shape (arch with the profile's layer count) and GPU."""
    return _calibration_cached(profile.model_dump_json(), arch, quantization)


@lru_cache(maxsize=32)
def _calibration_cached(profile_json: str, arch: ModelArchitecture, quantization: str) -> Calibration:
    profile = CalibrationProfile.model_validate_json(profile_json)
    m, e = profile.model, profile.engine
    shape = replace(arch, num_hidden_layers=m.num_hidden_layers, first_k_dense_replace=m.first_k_dense_replace)
    at_profile = _uncalibrated(
        shape, profile.gpu.name, quantization, tp=e.tp, dp=e.dp, dp_attention=e.dp_attention,
        sglang_version=e.sglang_version, load_format=None if m.real_like else m.load_format,
        mem_fraction_static=e.mem_fraction_static, chunked_prefill_tokens=e.chunked_prefill_size,
        cuda_graph_max_bs=e.cuda_graph_max_bs, page_size=e.page_size, context_length=e.context_length,
        attention_backend=e.attention_backend,
    )
    decode = fit_decode(profile.decode, m.num_hidden_layers, lambda bs: at_profile.weight_read_s(bs) + at_profile._comm_s(bs))
    prefill = _prefill_fit(profile, at_profile, m.num_hidden_layers)
    startup = with_capture_law(fit_startup(
        profile, weights_s=at_profile.weights_bytes_per_gpu() / (at_profile.gpu.dummy_init_gb_s * GB),
        kv_alloc_s=at_profile.gpu.kv_alloc_s, graph_sizes=len(at_profile.graph_batch_sizes()),
    ), profile)
    return Calibration(
        profile=profile.name, gpu=profile.gpu.name, layers=m.num_hidden_layers,
        sglang_version=e.sglang_version, tp=e.tp, decode=decode,
        efficiency_prefill=prefill.gemm, prefill_points=prefill.points, startup=startup,
        efficiency_attention=prefill.attention, efficiency_absorbed=prefill.absorbed,
        absorbed_points=prefill.absorbed_points, prefill_rms_rel=prefill.rms_rel,
        runtime_overhead_gb=runtime_overhead_gb(profile, at_profile.gpu.memory_bytes / GB), source=profile.raw,
        page_size=e.page_size,
        page_ratios=tuple((x.page_size, x.decode_step_ratio) for x in profile.page_size_effects),
        transfer_latency=tuple((x.page_size, x.time_s) for x in profile.transfer),
        attention_backend=e.attention_backend, kv_dtype_bytes=KV_DTYPE_BYTES.get(e.kv_cache_dtype, 2),
    )


def with_capture_law(startup: StartupCoeffs, profile: CalibrationProfile) -> StartupCoeffs:
    """A profile's warm capture, priced at another layer count by its layer shape's measured capture law (a shipped
    CaptureLayerLaw of the same shape and weight format, measured on a GPU of the profile's die) where there is one:
    a size's capture = the profile's x (f + (1 - f) L / L_profile), f = a / (a + b L_profile) of the law's line; the
    profile keeps its level (the law's host gives the form, not the level: lease 22's registered rule). Unchanged
    (per size x layer) where no law of the shape exists. Only the warm capture: the cold compile terms are per size."""
    own = gpu_spec(profile.gpu.name)
    law = next((x for x in shipped_capture_laws() if x.model.layer_shape() == profile.model.layer_shape()
                and (gpu_spec(x.gpu).bf16_tflops, gpu_spec(x.gpu).fp8_tflops) == (own.bf16_tflops, own.fp8_tflops)), None)
    if law is None or startup.graph_bs_layer_s is None or startup.graph_layers is None:
        return startup
    return replace(startup, graph_fixed_share=law.fixed_share(startup.graph_layers), graph_law_layers=law.counts(),
                   graph_law=f"{law.read}, {law.model.quantization.upper()} on {law.gpu}")


def _prefill_fit(profile: CalibrationProfile, at_profile: EngineCostModel, layers: int) -> PrefillShares:
    """Shares of peak of the profile's prefill forwards (GEMMs, MHA attention, absorbed-MLA attention): the
    forwards SGLang's log timed where the profile has them (the same method on every GPU), else the client's
    latencies; each forward after its fixed per-step cost and collectives."""
    logged = [p for p in profile.prefill if p.source == "server-log"]
    fixed = at_profile.gpu.step_overhead_s + layers * at_profile.gpu.layer_overhead_s
    rows = []
    for pt in logged or profile.prefill:
        new, cached = pt.requests_split()
        absorbed = at_profile.absorbed_prefill(cached)
        gemm = at_profile.prefill_compute_s(new, cached, attention=False)
        attention = at_profile.prefill_compute_s(new, cached, absorbed=absorbed) - gemm
        spent = pt.time_s - fixed - at_profile._comm_s(pt.new_tokens)
        if spent > 0:
            rows.append((gemm, 0.0 if absorbed else attention, attention if absorbed else 0.0, spent))
    return fit_prefill_shares(rows)


def find_calibration(
    gpu: str, arch: ModelArchitecture, quantization: str, profiles: list[CalibrationProfile] | None = None,
    load_format: str | None = "dummy", attention_tp: int = 1, ep: int = 1,
) -> Calibration | None:
    """The shipped profile's calibration for this GPU and layer shape; else the same shape on another GPU (with this
    GPU's process start); else a profile of another shape on this GPU, whose start-up figures only apply (its process
    start, graph capture per size and layer and cold compile: no figure of this shape's kernels exists). A profile
    without start-up runs takes the process start from this GPU's profile that has them and the capture, compile and
    cold JIT from its shape's start-ups on another GPU where there are some (R1 on H200: the R1-shaped H100 ones).

    A model no profile or routing curve measured (an exact match wins) whose layout (attention TP, EP) gives a GPU the
    per-GPU layer shard a measured model gives it at some layout (perfmodel/shard.py: lease 17's 32 / 2-head probe at
    TP 2 holds the 16 query / 1 KV heads of Qwen3-235B at TP 4) takes that model's calibration, saying so
    (Calibration.shard_lender)."""
    everything = profiles if profiles is not None else shipped_profiles()
    if not _measured(arch, quantization, everything):
        measured = [a for a in MODEL_PRESETS.values() if _measured(a, quantization, everything)]
        stand_in = shard_stand_in(arch, quantization, attention_tp, ep, measured)
        if stand_in is not None:
            cal = find_calibration(gpu, stand_in.arch, quantization, everything, load_format)
            return None if cal is None else replace(cal, shard_lender=stand_in.describe())
    pool = [p for p in everything if p.purpose == "calibration"]  # layer-count profiles only split the fixed time
    cal = _find_calibration(gpu, arch, quantization, pool, load_format, everything)
    if cal is None:
        return cal
    # what the layer shape alone decides: the experts dummy weights route to (any profile of the shape, else a
    # shipped routing curve of it), and the prefill share of peak where this GPU's profile has no prefill forwards
    shape = [p for p in pool if p.model.matches(arch, quantization)]
    by, routing = next(((p.name, p.routing) for p in shape if any(x.gate == "dummy" for x in p.routing)), None) or next(
        ((f"the routing curve of {c.raw}", c.routing) for c in _routing_curves() if c.model.matches(arch, quantization)), ("", []))
    if any(x.gate == "dummy" for x in routing):
        cal = replace(cal, dummy_routing=tuple(sorted((x.tokens, x.distinct_experts) for x in routing if x.gate == "dummy")),
                      routing_lender=None if by == cal.profile else by)
    if not cal.shape_matches:
        return lent_floor_split(cal, arch, quantization, everything)
    if cal.efficiency_prefill is None:  # this GPU's other profile of the shape first (prefill shares are per GPU)
        lenders = sorted((p for p in shape if p.prefill), key=lambda p: p.gpu.name != gpu)
        other = next((calibration_for(p, arch, quantization) for p in lenders), None)
        if other is not None:
            cal = replace(cal, efficiency_prefill=other.efficiency_prefill, prefill_points=other.prefill_points,
                          efficiency_attention=other.efficiency_attention, efficiency_absorbed=other.efficiency_absorbed,
                          absorbed_points=other.absorbed_points, prefill_rms_rel=other.prefill_rms_rel)
    floor = shape_step_floor(gpu, everything, arch, quantization)
    if floor is not None:  # this layer shape's own measured floor for its roofline forwards
        cal = replace(cal, floor_step_s=floor[0], floor_layer_s=floor[1])
    return split_fixed_time(cal, arch, quantization, everything)


def _measured(arch: ModelArchitecture, quantization: str, profiles: list[CalibrationProfile]) -> bool:
    """Does any profile (of any purpose) or routing curve measure `arch`'s own layer shape in this weight format?"""
    return any(p.model.matches(arch, quantization) for p in profiles) or any(
        c.model.matches(arch, quantization) for c in _routing_curves())


@lru_cache(maxsize=1)
def _routing_curves() -> tuple:
    return tuple(shipped_routing_curves())


def _find_calibration(
    gpu: str, arch: ModelArchitecture, quantization: str, pool: list[CalibrationProfile], load_format: str | None,
    everything: list[CalibrationProfile],
) -> Calibration | None:
    same_gpu = [p for p in pool if p.gpu.name == gpu]
    profile = find_profile(gpu, arch, quantization, pool, load_format)
    if profile is not None:
        cal = calibration_for(profile, arch, quantization)
        if not profile.startup:  # its start-up by phase; the memory outside the pool from this GPU's start-ups
            host = next((p for p in same_gpu if p.startup), None)
            overhead = cal.runtime_overhead_gb or (
                _startup_only(host.model_dump_json(), arch, quantization).runtime_overhead_gb if host else None)
            cal = replace(cal, startup=startup_by_phase(gpu, arch, quantization, pool) or cal.startup,
                          runtime_overhead_gb=overhead)
        return cal
    others = sorted((p for p in pool if p.model.matches(arch, quantization)),
                    key=lambda p: p.model.real_like != (load_format != "dummy"))
    if others:  # the shape's step costs from another GPU; its start-up by phase
        cal = calibration_for(others[0], arch, quantization)
        return replace(cal, startup=startup_by_phase(gpu, arch, quantization, pool) or cal.startup)
    if not same_gpu:
        return None
    startup = _startup_only(same_gpu[0].model_dump_json(), arch, quantization)
    startup = replace(startup, startup=startup_by_phase(gpu, arch, quantization, pool) or startup.startup)
    same_dims = next((p for p in sorted(pool, key=lambda p: p.gpu.name != gpu) if p.model.matches(arch, p.model.quantization)), None)
    if same_dims is not None:  # these layer dims measured in another weight format (R1 W4A8): that profile's graphed
        # fixed time per layer, as its own format's calibrated steps charge it at any layer count, and the expert share
        fp8 = split_fixed_time(calibration_for(same_dims, arch, same_dims.model.quantization), arch,
                               same_dims.model.quantization, everything)
        fixed = fp8.decode
        floor = shape_step_floor(gpu, everything, arch, same_dims.model.quantization) or (None, None)
        return replace(startup, graph_step_s=fp8.decode_step_s if fixed else None,
                       graph_layer_s=fixed.layer_s if fixed else None, graph_expert_read_share=expert_stream_share(gpu, pool),
                       floor_step_s=floor[0], floor_layer_s=floor[1])
    step_s, layer_s = graphed_step_floor(gpu, pool) or (None, None)
    lent = replace(startup, graph_step_s=step_s, graph_layer_s=layer_s, graph_expert_read_share=expert_stream_share(gpu, pool))
    return _lend_prefill_shares(lent, gpu, quantization, pool)


def _lend_prefill_shares(cal: Calibration, gpu: str, quantization: str, pool: list[CalibrationProfile]) -> Calibration:
    """A layer shape no profile measured (Qwen3) takes the GEMM and MHA-attention shares of peak of this GPU's
    profile in the same weight format that timed prefill forwards from its server log (else another GPU's with the
    same compute peaks): the same GEMM kernels (FP8 block-quantized dense and fused-MoE GEMMs) and the same triton
    extend-attention kernel, on other matrix sizes. Not the absorbed-MLA share: a GQA layer has no absorbed path.
    Checked, not fitted, on the Qwen3-shaped pair's lone 4,000-token forwards on one H100 (docs/fidelity.md)."""
    target = gpu_spec(gpu)
    lenders = sorted(
        (p for p in pool if p.model.quantization == quantization and any(x.source == "server-log" for x in p.prefill)
         and (gpu_spec(p.gpu.name).fp8_tflops, gpu_spec(p.gpu.name).bf16_tflops) == (target.fp8_tflops, target.bf16_tflops)),
        key=lambda p: p.gpu.name != gpu)
    arch = next((a for p in lenders for a in MODEL_PRESETS.values() if p.model.matches(a, quantization)), None)
    if arch is None:
        return cal
    lender = next(p for p in lenders if p.model.matches(arch, quantization))
    shares = calibration_for(lender, arch, quantization)
    return replace(cal, efficiency_prefill=shares.efficiency_prefill, prefill_points=shares.prefill_points,
                   efficiency_attention=shares.efficiency_attention, prefill_rms_rel=shares.prefill_rms_rel,
                   prefill_lender=lender.name)


def _fixed_time_points(profiles: list[CalibrationProfile]) -> list[tuple[CalibrationProfile, int, float]]:
    """(profile, layers, fixed seconds per graphed decode step) of each profile with a decode fit: what its graphed
    steps leave after their reads at WEIGHT_READ_EFFICIENCY, layers x layer_s."""
    out = []
    for profile in profiles:
        arch = next((a for a in MODEL_PRESETS.values() if profile.model.matches(a, profile.model.quantization)), None)
        decode = calibration_for(profile, arch, profile.model.quantization).decode if arch is not None else None
        if decode is not None:
            out.append((profile, profile.model.num_hidden_layers, profile.model.num_hidden_layers * decode.layer_s))
    return out


def _same_die(gpu: str, pool: list[CalibrationProfile]) -> list[CalibrationProfile]:
    target = gpu_spec(gpu)
    return [p for p in pool if (gpu_spec(p.gpu.name).bf16_tflops, gpu_spec(p.gpu.name).fp8_tflops)
            == (target.bf16_tflops, target.fp8_tflops)]


def layer_count_split(gpu: str, pool: list[CalibrationProfile], arch: ModelArchitecture,
                      quantization: str) -> tuple[float, ProfileModel] | None:
    """(per-layer fixed seconds of a graphed decode step, the layer shape it was measured on) from the layer-count
    profiles (purpose "layer-count": one shape's decode grid at several layer counts on one host, scripts/device/
    layer_probe.sh) of `arch`'s layer shape on GPUs with `gpu`'s compute peaks: the least-squares slope of each count's
    fixed time (its decode fit's) over its layer count, each GPU its own intercept; another shape's counts never enter
    (Qwen3's: lent_floor_split). Only counts above the shape's dense layers enter (each adds MoE layers, as R1's 61 do
    over its 3 dense). None where the shape was not measured at two such counts."""
    groups: dict[tuple, list[tuple[int, float]]] = {}
    shapes: dict[tuple, ProfileModel] = {}
    counted = [p for p in _same_die(gpu, pool) if p.purpose == "layer-count" and p.model.matches(arch, quantization)
               and p.model.num_hidden_layers > p.model.first_k_dense_replace]
    for profile, layers, fixed in _fixed_time_points(counted):
        key = (profile.gpu.name, profile.model.layer_shape())
        groups.setdefault(key, []).append((layers, fixed))
        shapes[key] = profile.model
    centred = [(x - float(np.mean([a for a, _ in pts])), y - float(np.mean([b for _, b in pts])))
               for pts in groups.values() for x, y in pts]
    spread = sum(dx * dx for dx, _ in centred)
    if spread == 0:
        return None
    layer_s = sum(dx * dy for dx, dy in centred) / spread
    return float(layer_s), next(iter(shapes.values()))


def graphed_step_floor(gpu: str, pool: list[CalibrationProfile]) -> tuple[float, float] | None:
    """(per step, per layer) fixed seconds of a CUDA-graphed decode step on `gpu` for a layer shape measured at one layer
    count only (gpus.GpuSpec holds them): each calibration profile's decode fit leaves, after its reads at
    WEIGHT_READ_EFFICIENCY, layers x layer_s of fixed time per step; one slope of (layers, that time) over the GPUs with
    the same compute peaks, each GPU its own intercept (same die, other HBM and hosts), splits it. Shipped: R1-shaped 6
    layers (H100, H200 twice), V2-Lite 27 (H200) -> ~44 us per layer, ~0.64 ms (H100) / ~1.15 ms (H200) per step: a
    slope across two layer shapes. Assumed: a GQA layer (FA3, Triton MoE) has as many small kernels as an MLA one. A
    shape measured at several layer counts on one host has its own floor (shape_step_floor: R1-shaped, lease 8)."""
    points: dict[str, list[tuple[int, float]]] = {}
    for profile, layers, fixed in _fixed_time_points([p for p in _same_die(gpu, pool) if p.purpose == "calibration"]):
        points.setdefault(profile.gpu.name, []).append((layers, fixed))
    # one slope, each GPU its own intercept: only a GPU with two layer counts tells the slope anything
    centred = [(x - float(np.mean([a for a, _ in pts])), y - float(np.mean([b for _, b in pts])))
               for pts in points.values() for x, y in pts]
    spread = sum(dx * dx for dx, _ in centred)
    if gpu not in points or spread == 0:
        return None
    layer_s = max(0.0, sum(dx * dy for dx, dy in centred) / spread)
    step_s = max(0.0, float(np.mean([y - x * layer_s for x, y in points[gpu]])))
    return step_s, float(layer_s)


def shape_step_floor(gpu: str, pool: list[CalibrationProfile], arch: ModelArchitecture,
                     quantization: str) -> tuple[float, float] | None:
    """(per step, per layer) fixed seconds of a graphed decode step on `gpu` for a layer shape measured at several layer
    counts on one host (layer_count_split: R1-shaped 4, 5, 6 layers on one H100, lease 8): per layer the measured slope
    (every GPU with the same compute peaks), per step the mean of fixed time - layers x slope over this GPU's profiles of
    the shape with MoE layers. It prices the roofline forwards of that shape (a TP group across nodes, every prefill
    forward) in place of the GPU's cross-shape floor (graphed_step_floor); None where the shape has no such split."""
    split = layer_count_split(gpu, pool, arch, quantization)
    if split is None or not split[1].matches(arch, quantization):
        return None
    layer_s, shape = split
    own = [(layers, fixed) for _, layers, fixed in _fixed_time_points(
        [p for p in pool if p.gpu.name == gpu and p.model.layer_shape() == shape.layer_shape()
         and p.model.num_hidden_layers > p.model.first_k_dense_replace])]
    if not own:
        return None
    return max(0.0, float(np.mean([y - x * layer_s for x, y in own]))), max(0.0, layer_s)


def lent_floor_split(cal: Calibration, arch: ModelArchitecture, quantization: str,
                     pool: list[CalibrationProfile]) -> Calibration:
    """A layer shape no profile calibrates (its graphed step: the roofline plus the GPU's lent floor, Qwen3) measured at
    two or more layer counts on this GPU's host (layer-count profiles, lease 11): its own floor, per step and per layer,
    in place of the lent one, for its graphed steps and its roofline forwards alike. Each count's fixed time F(L) is
    read as the probe registered it (benchmarks/qwen3_layer_count.py): the median over its graphed decode points of the
    measured step less the model's own non-fixed part there (its step at the lent floor less that floor); the
    least-squares line through (L, F(L)) of this GPU's counts splits it, whatever its slope. Counts of another host never
    enter: a GPU without its own keeps the lent floor. Unchanged where `cal` has no lent floor."""
    if cal.graph_step_s is None or cal.graph_layer_s is None:
        return cal
    counts = [p for p in pool if p.purpose == "layer-count" and p.gpu.name == cal.gpu and p.model.matches(arch, quantization)]
    fixed = [(p.model.num_hidden_layers, _lent_fixed_time(p, arch, quantization, cal)) for p in counts]
    fixed = [(layers, f) for layers, f in fixed if f is not None]
    if len({layers for layers, _ in fixed}) < 2:
        return cal
    x = np.array([[1.0, layers] for layers, _ in fixed])
    (step_s, layer_s), *_ = np.linalg.lstsq(x, np.array([f for _, f in fixed]), rcond=None)
    step_s, layer_s = max(0.0, float(step_s)), max(0.0, float(layer_s))
    return replace(cal, graph_step_s=step_s, graph_layer_s=layer_s, floor_step_s=step_s, floor_layer_s=layer_s,
                   floor_counts=tuple(sorted({layers for layers, _ in fixed})))


def _lent_fixed_time(profile: CalibrationProfile, arch: ModelArchitecture, quantization: str,
                     lent: Calibration) -> float | None:
    """F(L) of one layer-count profile of a lent-floor shape: the median over its graphed decode points of the measured
    step less the model's step there at the lent floor, plus that floor (None: no graphed point)."""
    e = profile.engine
    at_count = EngineCostModel(
        arch=replace(arch, num_hidden_layers=profile.model.num_hidden_layers), gpu=gpu_spec(profile.gpu.name),
        quantization=quantization, calibration=lent, attention_backend=e.attention_backend,
        context_length=e.context_length, page_size=e.page_size, load_format=profile.model.load_format)
    floor = lent.graph_step_s + profile.model.num_hidden_layers * lent.graph_layer_s  # type: ignore[operator]
    left = [pt.step_s - (at_count.decode_step_s(pt.batch_size, pt.context_tokens) - floor)
            for pt in profile.decode if pt.cuda_graph]
    return float(np.median(left)) if left else None


def split_fixed_time(cal: Calibration, arch: ModelArchitecture, quantization: str,
                     pool: list[CalibrationProfile]) -> Calibration:
    """A calibrated decode path whose layer shape was measured at several layer counts (layer_count_split): its
    profile's fixed time at its own layer count stays, split into a per-step part and the measured per-layer part, so
    another layer count (R1's 61 from a 6-layer profile) adds or drops the measured per-layer time only. Unchanged
    where no split of this shape exists, or where the slope exceeds the profile's whole fixed time per layer."""
    split = layer_count_split(cal.gpu, pool, arch, quantization) if cal.decode is not None and cal.shape_matches else None
    if split is None or cal.decode is None or not split[1].matches(arch, quantization) or split[0] > cal.decode.layer_s:
        return cal
    layer_s = max(0.0, split[0])
    return replace(cal, decode=replace(cal.decode, layer_s=layer_s),
                   decode_step_s=cal.layers * (cal.decode.layer_s - layer_s))


def expert_stream_share(gpu: str, pool: list[CalibrationProfile]) -> float | None:
    """Share of datasheet HBM bandwidth at which SGLang's fused-MoE kernel streams routed experts in a graphed decode
    step, for a layer shape no profile measured; None where no pair of profiles measured it.

    Two profiles of one layer shape on one GPU that differ only in routing (dummy weights as loaded vs randomised
    gates: the same server, kernels and floor) differ at a (batch, context) they both ran by the routed experts the
    two routings read (uniform vs the measured dummy curve); the median over those points of bytes / time difference,
    over datasheet HBM, is the kernel's read share. Shipped: R1-shaped 6 layers FP8 on H200 (12 points, 0.88); taken
    for every GPU with the same compute peaks in the same weight format (Hopper's die; H100's HBM3 assumed to reach
    the same share as H200's HBM3e). Nothing of a Qwen3 run enters it."""
    target = gpu_spec(gpu)
    shares = []
    pool = [p for p in pool if p.purpose == "calibration"]
    for real in (p for p in pool if p.model.real_like):
        other = gpu_spec(real.gpu.name)
        if (other.bf16_tflops, other.fp8_tflops) != (target.bf16_tflops, target.fp8_tflops):
            continue
        dummy = next((p for p in pool if not p.model.real_like and p.gpu.name == real.gpu.name
                      and p.model.layer_shape() == real.model.layer_shape()
                      and p.model.num_hidden_layers == real.model.num_hidden_layers), None)
        arch = next((a for a in MODEL_PRESETS.values() if real.model.matches(a, real.model.quantization)), None)
        if dummy is None or arch is None or not any(x.gate == "dummy" for x in dummy.routing):
            continue
        m = real.model
        shape = replace(arch, num_hidden_layers=m.num_hidden_layers, first_k_dense_replace=m.first_k_dense_replace)
        routed = _uncalibrated(shape, real.gpu.name, m.quantization).weight_bytes_breakdown()["routed_experts"]
        curve = tuple(sorted((x.tokens, x.distinct_experts) for x in dummy.routing if x.gate == "dummy"))
        dummy_steps = {(x.batch_size, x.context_tokens): x.step_s for x in dummy.decode if x.cuda_graph}
        k, experts = arch.num_experts_per_tok, arch.n_routed_experts
        for x in real.decode:
            same = dummy_steps.get((x.batch_size, x.context_tokens)) or _nearest_context(dummy_steps, x)
            extra = routed * (experts_hit_fraction(x.batch_size, k, experts)
                              - experts_hit_fraction(x.batch_size, k, experts, True, curve))
            if x.cuda_graph and same is not None and extra > 0 and x.step_s > same:
                shares.append(extra / (x.step_s - same) / (other.hbm_tb_s * 1e12))
    return float(np.median(shares)) if shares else None


def _nearest_context(steps: dict[tuple[int, int], float], point) -> float | None:
    """The dummy profile's step at the same batch and a context within 5 % (the two servers' prompts differ slightly)."""
    near = [(abs(c - point.context_tokens), s) for (b, c), s in steps.items()
            if b == point.batch_size and abs(c - point.context_tokens) <= 0.05 * point.context_tokens]
    return min(near)[1] if near else None


def startup_by_phase(gpu: str, arch: ModelArchitecture, quantization: str, pool: list[CalibrationProfile]) -> StartupCoeffs | None:
    """A server's start-up phases, each from the profiles whose start-ups share what the phase depends on: the process
    start (imports, init, scheduler: host and image) from this GPU's start-ups, the layer shape's own first; graph
    capture, its cold compile and the cold JIT (the kernels a layer shape builds) from the shape's own start-ups, this
    GPU's first, else another GPU's (R1 on H200: the R1-shaped H100 ones; V2-Lite on H100: its H200 profile's). A shape
    with no start-up anywhere takes this GPU's other shape's figures whole (no figure of its kernels exists); a GPU with
    none, the shape's own process start. None where no profile of the pool measured a start-up.

    Why by phase: V2-Lite's first graph size compiled in 56-75 s on eight H100 machines, as its H200 profile's 52 s
    and not the R1-shaped H100 profile's 89 s, and captured warm in 10-15 s for 36 sizes, not 45 s; the three R1-shaped
    cold starts on H200 captured as the R1-shaped H100 figures give (docs/fidelity.md, "V2-Lite's start-up on H100" and
    "Start-up terms from the logs")."""
    measured = [p for p in pool if p.startup]
    shape = sorted((p for p in measured if p.model.matches(arch, quantization)), key=lambda p: p.gpu.name != gpu)
    host = sorted((p for p in measured if p.gpu.name == gpu), key=lambda p: not p.model.matches(arch, quantization))
    host_startup = _startup_only(host[0].model_dump_json(), arch, quantization).startup if host else None
    if not shape:
        return host_startup
    own = calibration_for(shape[0], arch, quantization).startup
    if host_startup is None or shape[0] is host[0]:
        return own
    return replace(own, process_s=host_startup.process_s)


@lru_cache(maxsize=32)
def _startup_only(profile_json: str, arch: ModelArchitecture, quantization: str) -> Calibration:
    profile = CalibrationProfile.model_validate_json(profile_json)
    e = profile.engine
    at_profile = _uncalibrated(
        arch, profile.gpu.name, quantization, tp=e.tp, sglang_version=e.sglang_version, mem_fraction_static=e.mem_fraction_static or 0.85,
        cuda_graph_max_bs=e.cuda_graph_max_bs, context_length=e.context_length,
    )
    startup = fit_startup(profile, weights_s=0.0, kv_alloc_s=at_profile.gpu.kv_alloc_s,
                          graph_sizes=len(at_profile.graph_batch_sizes()))
    return Calibration(
        profile=profile.name + " (start-up only: another layer shape)", gpu=profile.gpu.name,
        layers=profile.model.num_hidden_layers, sglang_version=e.sglang_version, tp=e.tp, decode=None,
        efficiency_prefill=None, prefill_points=0, startup=startup, runtime_overhead_gb=None, source=profile.raw,
        page_size=e.page_size, shape_matches=False, attention_backend=e.attention_backend or "triton",
    )

