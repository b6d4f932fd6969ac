"""From a calibration profile's measured points to the coefficients the cost model uses.

profile (perfmodel/profile.py) -> Calibration:
- decode: one GPU's decode step on the profile GPU = weight/expert bytes at HBM speed (physics, scales
  with TP and GPU) + per layer (l0 + l_req x requests + l_ctx x context tokens), fitted by least squares
  on the CUDA-graph points (eager steps, beyond the largest captured graph, are launch-bound: server/forward.py's
  eager_launch_s, fitted on every profile's eager points by benchmarks/eager_launch_cost.py). Per-request and
  per-context terms are one GPU's share: they divide by TP on the target (heads and expert slices
  split over TP ranks); per-layer terms scale with the target's layer count.
- prefill: shares of peak FLOP/s of the GEMMs, of MHA attention pairs and of absorbed-MLA attention pairs
  (a triton batch with a cached prefix), medians over the measured forwards each part leads
  (fit_prefill_shares); prefill is compute-bound, so the shares transfer to other layer counts and TP
  sizes of the same layer shape on the same GPU.
- start-up: process + init (launch -> ready minus weights, KV and graphs, warm), graph capture per
  batch size per layer (warm), with cold caches the first captured size's compile once (where a cold log timed
  it: the kernels the later sizes reuse) and a rest per further size (Triton/DeepGEMM kernels are compiled per
  shape, not per layer), other cold JIT (first forwards).
- memory: runtime memory outside SGLang's static pool after start (CUDA context, graph pool, NCCL),
  from `free_after_init_gb`, to check the activation headroom a setting leaves.

Only coefficients the points determine are fitted; the rest stay None and the cost model keeps its
roofline defaults for them (the plan says which applies).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.perfmodel.profile import CalibrationProfile, DecodePoint

GB = 1e9
# A decode fit whose RMS relative error on its own points exceeds this is not used (the roofline stays).
MAX_FIT_RMS = 0.25


@dataclass(frozen=True)
class DecodeCoeffs:
    layer_s: float
    layer_per_req_s: float
    layer_per_ctx_s: float
    graph_points: int
    eager_points: int  # not fitted here: gpus.GpuSpec eager_launch_* (benchmarks/eager_launch_cost.py)
    graph_rms_rel: float  # root-mean-square relative error of the fit on its own points


@dataclass(frozen=True)
class StartupCoeffs:
    process_s: float | None  # warm: launch -> ready minus weights, KV and graph capture
    graph_bs_layer_s: float | None  # warm capture per batch size per layer
    graph_bs_cold_s: float | None  # extra per batch size with empty compile caches (beyond the first, if known)
    jit_cold_s: float | None  # other cold-cache cost (first forwards, DeepGEMM)
    graph_once_cold_s: float | None = None  # the compile the first captured size pays once with empty caches
    kv_alloc_s: float | None = None  # the KV pool's allocation, the median of the profile's measured starts
    graph_layers: int | None = None  # the layer count graph_bs_layer_s was measured at (the profile's)
    # the share of a size's warm capture at graph_layers that does not grow with the layers, where a capture law of the
    # shape was measured (calibration_lookup.with_capture_law); None: capture per size x layer, proportional
    graph_fixed_share: float | None = None
    graph_law: str | None = None  # what measured that share: the law's read, weight format and host
    graph_law_layers: tuple[int, int] | None = None  # the smallest and largest layer count the law measured

    def capture_layers(self, layers: int) -> float:
        """The layer count a size's warm capture is priced at: `layers` itself (per size x layer), or under a measured
        law f x graph_layers + (1 - f) x layers (a size's capture = the profile's x (f + (1 - f) L / L_profile))."""
        if self.graph_fixed_share is None or self.graph_layers is None:
            return float(layers)
        f = self.graph_fixed_share
        return f * self.graph_layers + (1 - f) * layers


@dataclass(frozen=True)
class Calibration:
    """Coefficients of one profile, for its GPU, its layer shape and its SGLang version."""

    profile: str
    gpu: str
    layers: int
    sglang_version: str
    tp: int
    decode: DecodeCoeffs | None
    efficiency_prefill: float | None
    prefill_points: int
    startup: StartupCoeffs
    runtime_overhead_gb: float | None
    source: str  # the profile's raw path
    page_size: int = 1  # the page size the decode points were measured at
    page_ratios: tuple[tuple[int, float], ...] = ()  # (page size, decode step ratio to page_size), measured
    transfer_latency: tuple[tuple[int, float], ...] = ()  # (page size, mean per-request KV transfer s), measured
    shape_matches: bool = True  # False: only the start-up figures apply (a profile of another shape, same GPU)
    attention_backend: str = "triton"  # the backend the decode points were measured with
    dummy_routing: tuple[tuple[int, float], ...] = ()  # (decode batch, distinct routed experts), dummy weights, measured
    # where dummy_routing was measured on another profile of the shape (or a routing curve) than this one: its name
    # (calibration_lookup.find_calibration); None where it is this profile's own or there is none
    routing_lender: str | None = None
    kv_dtype_bytes: int = 2  # bytes per KV element of the profile's --kv-cache-dtype (its per-context term read these)
    efficiency_attention: float | None = None  # share of peak of MHA prefill attention pairs (None: efficiency_prefill)
    efficiency_absorbed: float | None = None  # share of peak of absorbed-MLA prefill attention (PrefillTerms.absorbed_prefill)
    absorbed_points: int = 0
    prefill_rms_rel: float | None = None  # the prefill fit's RMS relative error on its own forwards
    # a start-up-only calibration (another layer shape): the fixed costs of a CUDA-graphed decode step on this GPU,
    # per step and per layer, from its measured profiles (calibration_lookup.graphed_step_floor); None where none measured
    graph_step_s: float | None = None
    graph_layer_s: float | None = None
    # ... and the share of datasheet HBM at which its fused-MoE kernel streams routed experts, measured on a pair of
    # profiles that differ only in routing (calibration_lookup.expert_stream_share); None: WEIGHT_READ_EFFICIENCY
    graph_expert_read_share: float | None = None
    # a layer shape no profile measured: the profile (same GPU, same weight format, another shape) whose prefill
    # shares of peak it borrows (calibration_lookup._lend_prefill_shares); None where the shares are the profile's own
    prefill_lender: str | None = None
    # the per-step part of a graphed decode step's fixed time where a layer-count split applies (calibration_lookup.
    # layer_count_split): the profile's own fixed time at its layer count less that count x the measured per-layer
    # part, which decode.layer_s then holds; 0.0: the whole fixed time is per layer (decode.layer_s)
    decode_step_s: float = 0.0
    # a layer shape measured at several layer counts (calibration_lookup.shape_step_floor): its own graphed floor, per
    # step and per layer, for its roofline forwards (a TP group across nodes, prefill); None: the GPU's (gpus.GpuSpec)
    floor_step_s: float | None = None
    floor_layer_s: float | None = None
    # the layer counts of this shape's own layer-count profiles on this GPU that graph_step_s / graph_layer_s were split
    # from (calibration_lookup.lent_floor_split); (): the floor is lent from profiles of other shapes
    floor_counts: tuple[int, ...] = ()
    # a model no profile measured, priced by the profiles of another model whose layout gives a GPU the same layer shard
    # (calibration_lookup.find_calibration, perfmodel/shard.py): which model, at which layout, and the shard; None:
    # this model's own profiles (or none)
    shard_lender: str | None = None

    def transfer_latency_s(self, page_size: int) -> float | None:
        """Mean measured per-request KV transfer time at this page size (log-linear between sizes)."""
        import math

        by_page: dict[int, list[float]] = {}
        for page, seconds in self.transfer_latency:
            by_page.setdefault(page, []).append(seconds)
        known = sorted((p, statistics.mean(v)) for p, v in by_page.items())
        if not known:
            return None
        if page_size <= known[0][0]:
            return known[0][1]
        for (p0, t0), (p1, t1) in zip(known, known[1:]):
            if p0 <= page_size <= p1:
                f = (math.log(page_size) - math.log(p0)) / (math.log(p1) - math.log(p0))
                return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
        return known[-1][1]

    def page_factor(self, page_size: int) -> float:
        """Decode step ratio at `page_size`: measured points, log-linear between them, flat outside."""
        import math

        known = sorted({(self.page_size, 1.0), *self.page_ratios})
        if len(known) == 1 or page_size <= known[0][0]:
            return known[0][1] if page_size <= known[0][0] else known[-1][1]
        for (p0, r0), (p1, r1) in zip(known, known[1:]):
            if p0 <= page_size <= p1:
                t = (math.log(page_size) - math.log(p0)) / (math.log(p1) - math.log(p0))
                return r0 + t * (r1 - r0)
        return known[-1][1]

    def routing_note(self, load_format: str | None) -> str | None:
        """For a dummy-weight server whose routing curve another profile measured: whose it is; else None."""
        if self.routing_lender is None or load_format != "dummy":
            return None
        return f"dummy-weight expert routing from {self.routing_lender} (the same layer shape; {self.profile} measured none)"

    def shard_note(self) -> str | None:
        """Where another model's profiles price this one (the same per-GPU layer shard): which and why; else None."""
        if self.shard_lender is None:
            return None
        return f"priced by {self.shard_lender}; no profile measured this model's own layer"

    def describe(self) -> str:
        parts = [f"profile {self.profile} ({self.gpu}, {self.layers} layers, SGLang {self.sglang_version})"]
        if self.decode:
            parts.append(f"decode fit on {self.decode.graph_points}+{self.decode.eager_points} points")
        if self.efficiency_prefill:
            parts.append(f"prefill {self.efficiency_prefill:.0%} of peak")
        if self.efficiency_attention:
            parts.append(f"attention {self.efficiency_attention:.0%}")
        if self.efficiency_absorbed:
            parts.append(f"absorbed-MLA attention {self.efficiency_absorbed:.1%}")
        return ", ".join(parts)


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0: drop the most negative column until none is negative."""
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            return coef
        active.pop(int(np.argmin(sol)))
    return coef


def _rel_weights(y: np.ndarray) -> np.ndarray:
    """Relative-error weighting: each point counts by 1/y so small and large steps weigh alike."""
    return 1.0 / np.maximum(y, 1e-9)


def fit_decode(
    points: Sequence[DecodePoint],
    layers: int,
    weight_read_s: Callable[[int], float],
) -> DecodeCoeffs | None:
    """Fit the per-layer decode terms; `weight_read_s(batch)` is the weight/expert read time at that batch."""
    graph = [p for p in points if p.cuda_graph]
    if len(graph) < 2:
        return None
    y = np.array([p.step_s - weight_read_s(p.batch_size) for p in graph])
    x = np.array([[layers, layers * p.batch_size, layers * p.context_tokens] for p in graph], dtype=float)
    w = _rel_weights(np.array([p.step_s for p in graph]))
    ctx_varies = len({round(p.context_tokens / max(1, p.batch_size)) for p in graph}) > 1
    if not ctx_varies:  # context grows with batch here: the two terms cannot be told apart
        x[:, 2] = 0.0
    coef = _nnls(x * w[:, None], y * w)
    measured = np.array([p.step_s for p in graph])
    predicted = np.array([weight_read_s(p.batch_size) for p in graph]) + x @ coef
    # one refit without points more than 50 % off the first fit (an interval with a stall in it)
    keep = np.abs(predicted - measured) / measured <= 0.5
    if keep.sum() >= 2 and not keep.all():
        coef = _nnls((x * w[:, None])[keep], (y * w)[keep])
        predicted = np.array([weight_read_s(p.batch_size) for p in graph]) + x @ coef
        graph = [p for p, k in zip(graph, keep) if k]
        predicted, measured = predicted[keep], measured[keep]
    graph_rms = float(np.sqrt(np.mean(((predicted - measured) / measured) ** 2)))

    if graph_rms > MAX_FIT_RMS:
        # the form does not explain the profile's own points (e.g. dummy weights route every token to the
        # same experts, so the expert reads a uniform router implies never happen): keep the roofline
        return None
    eager = [p for p in points if not p.cuda_graph]
    return DecodeCoeffs(
        layer_s=float(coef[0]), layer_per_req_s=float(coef[1]), layer_per_ctx_s=float(coef[2]),
        graph_points=len(graph), eager_points=len(eager), graph_rms_rel=graph_rms,
    )


@dataclass(frozen=True)
class PrefillShares:
    """Shares of peak FLOP/s of one layer shape's prefill forwards on one GPU, fitted on timed forwards."""

    gemm: float | None  # projections, MLPs, experts, lm_head
    attention: float | None  # MHA (query, key) pairs
    absorbed: float | None  # absorbed-MLA pairs (a batch with a cached prefix on triton)
    points: int
    absorbed_points: int
    rms_rel: float | None


# A forward whose attention costs under this fraction of its GEMMs (at peak) measures the GEMMs' share; one whose
# attention costs more measures the attention's share (its GEMMs at the share just found).
ATTENTION_LED = 0.1
MIN_LED = 3  # fewer forwards led by a part leave its share unfitted (None)


def fit_prefill_shares(points: Sequence[tuple[float, float, float, float]]) -> PrefillShares:
    """(GEMM, MHA attention, absorbed attention FLOP time at 100 % of peak, measured seconds) per forward ->
    each part's share of peak, as medians (robust to a log gap with a stall in it): the GEMMs' over the forwards
    whose attention is small, then each attention path's over the forwards it leads, after their GEMMs at that
    share. The GEMMs' share comes from MHA-path forwards where there are any (the absorbed path carries more than
    its pairs), else from every forward whose attention is small.
    Forwards faster than peak (a gap artefact) are left out; a part fewer than MIN_LED forwards lead gets None."""
    usable = [p for p in points if p[3] > sum(p[:3]) > 0]
    gemm_led = [p for p in usable if p[2] == 0 and p[1] < ATTENTION_LED * p[0]]
    if not gemm_led:  # every forward ran the absorbed path (V2-Lite's ShareGPT batches all hit the radix cache)
        gemm_led = [p for p in usable if p[1] + p[2] < ATTENTION_LED * p[0]]
    if not gemm_led:
        return PrefillShares(None, None, None, 0, 0, None)

    def share(col: int, gemm: float) -> tuple[float | None, int]:
        ratios = [p[col] / (p[3] - p[0] / gemm) for p in usable if p[col] >= ATTENTION_LED * p[0] and p[3] > p[0] / gemm]
        return (float(statistics.median(ratios)) if len(ratios) >= MIN_LED else None), len(ratios)

    attention = absorbed = None
    for _ in range(2):  # the GEMM-led forwards' small attention, at the shares of the pass before, then refit
        rest = [(p[0], p[3] - p[1] / (attention or np.inf) - p[2] / (absorbed or np.inf)) for p in gemm_led]
        gemm = float(statistics.median(g / t for g, t in rest if t > 0))
        (attention, _), (absorbed, n_absorbed) = share(1, gemm), share(2, gemm)
    predicted = [g / gemm + mha / (attention or gemm) + ab / (absorbed or gemm) for g, mha, ab, _ in usable]
    rms = float(np.sqrt(np.mean([((t - p[3]) / p[3]) ** 2 for t, p in zip(predicted, usable)])))
    return PrefillShares(gemm, attention, absorbed, len(usable), n_absorbed, rms)


def fit_startup(profile: CalibrationProfile, weights_s: float, kv_alloc_s: float, graph_sizes: int) -> StartupCoeffs:
    """Start-up coefficients from the profile's cold and warm starts (None where no run shows them)."""
    layers = profile.model.num_hidden_layers
    measured_kv = [r.kv_alloc_s for r in profile.startup if r.kv_alloc_s is not None]
    kv_alloc_s = statistics.median(measured_kv) if measured_kv else kv_alloc_s
    warm = [r for r in profile.startup if r.caches == "warm"]
    cold = [r for r in profile.startup if r.caches == "cold"]

    def sizes(run) -> int:
        return run.graph_batch_sizes or graph_sizes

    warm_graph = [r.graph_capture_s / (sizes(r) * layers) for r in warm if r.graph_capture_s and r.role != "prefill"]
    graph_bs_layer = statistics.median(warm_graph) if warm_graph else None
    def graphs_of(run) -> float:
        if run.graph_capture_s is not None:
            return run.graph_capture_s
        return (graph_bs_layer or 0.0) * sizes(run) * layers if run.role != "prefill" else 0.0

    process = [
        r.ready_s - (r.weights_s if r.weights_s is not None else weights_s)
        - (r.kv_alloc_s if r.kv_alloc_s is not None else kv_alloc_s) - graphs_of(r)
        for r in warm if r.ready_s is not None
    ]
    process_s = statistics.median(process) if process else None
    # With empty caches the first captured size compiles the kernels every later size reuses: where a cold run's
    # log shows the first size's capture, that compile is paid once and only the rest's excess is per size; else
    # the whole excess is spread over the sizes (the older reading)
    warm_size = (graph_bs_layer or 0.0) * layers
    split = [(r.graph_capture_s, r.first_graph_capture_s, sizes(r)) for r in cold
             if r.graph_capture_s and r.first_graph_capture_s and r.role != "prefill" and sizes(r) > 1]
    once = [first - warm_size for _, first, _ in split]
    graph_once_cold = statistics.median(once) if once else None
    cold_graph = [
        max(0.0, (capture - first - warm_size * (n - 1)) / (n - 1)) for capture, first, n in split
    ] or [
        (r.graph_capture_s - warm_size * sizes(r)) / sizes(r)
        for r in cold if r.graph_capture_s and r.role != "prefill"
    ]
    graph_bs_cold = statistics.median(cold_graph) if cold_graph else None
    jit = []
    if process_s is not None:
        for r in cold:
            if r.ready_s is None or (r.graph_capture_s is None and graph_bs_cold is None):
                continue
            graphs = r.graph_capture_s if r.graph_capture_s is not None else (
                ((graph_bs_layer or 0.0) * layers + (graph_bs_cold or 0.0)) * sizes(r) if r.role != "prefill" else 0.0
            )
            jit.append(r.ready_s - process_s - weights_s - kv_alloc_s - graphs)
    jit_cold = max(0.0, statistics.median(jit)) if jit else None
    return StartupCoeffs(process_s=process_s, graph_bs_layer_s=graph_bs_layer, graph_bs_cold_s=graph_bs_cold,
                         jit_cold_s=jit_cold, graph_once_cold_s=graph_once_cold,
                         kv_alloc_s=statistics.median(measured_kv) if measured_kv else None, graph_layers=layers)


def runtime_overhead_gb(profile: CalibrationProfile, gpu_memory_gb: float) -> float | None:
    """Memory outside the static pool after start: (1 - fraction) x GPU memory - free after init (median)."""
    seen = [
        (1 - m.mem_fraction_static) * gpu_memory_gb - m.free_after_init_gb
        for m in profile.memory if m.free_after_init_gb is not None
    ]
    return statistics.median(seen) if seen else None
