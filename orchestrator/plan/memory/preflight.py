"""The memory preflight of a whole layout (check_layout_fits; require_fit, which `bench` runs before any bring-up), and
the one-change layouts that fit when it does not."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.config import RunConfig, config_from_dict
from orchestrator.plan.memory.report import LayoutDoesNotFit, MemoryReport
from orchestrator.plan.memory.server_fit import group_memory
from orchestrator.plan.memory.shared_gpu import gpu_sharing, judge_shared_gpu


def check_layout_fits(
    cfg: RunConfig,
    batch: Sequence[tuple[int, int]] | None = None,
    gpu: str | None = None,
    suggest: bool = True,
) -> MemoryReport:
    """Memory preflight of every group on the target GPUs; when something does not fit, list options."""
    report = MemoryReport(
        model=cfg.model.architecture().name,
        quantization=cfg.model.quantization,
        groups=[group_memory(cfg, role, i, g, batch, gpu) for role, i, g in cfg.layout.groups()],
    )
    judged: set[str] = set()
    for residents in gpu_sharing(cfg):
        report.shared.append(judge_shared_gpu(cfg, residents, report.groups, judged, batch, gpu))
    if suggest and not report.fits:
        report.options = nearest_fitting_layouts(cfg, gpu)
    return report


def require_fit(cfg: RunConfig, force: bool = False, batch: Sequence[tuple[int, int]] | None = None) -> MemoryReport:
    """The preflight `bench` runs: raise LayoutDoesNotFit unless it fits or `force` is set."""
    report = check_layout_fits(cfg, batch)
    if not report.fits and not force:
        raise LayoutDoesNotFit(report)
    return report


def _with(cfg: RunConfig, **changes: object) -> RunConfig | None:
    """A copy of cfg with changes applied (key 'a__b' sets data['a']['b']), or None if that is not valid."""
    data = cfg.model_dump(mode="json")
    for path, value in changes.items():
        node = data
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    try:
        return config_from_dict(data)
    except ValueError:
        return None


def nearest_fitting_layouts(cfg: RunConfig, gpu: str | None = None) -> list[str]:
    """One-change alternatives that fit: 4-bit checkpoint, H200 nodes, aggregated TP16 or TP8xPP2 over both nodes."""
    per_node = cfg.cluster.gpus_per_node
    quant = cfg.model.quantization
    # (label, changed config, GPU to check it on: the H200 option must not keep an explicit `gpu`)
    candidates: list[tuple[str, RunConfig | None, str | None]] = []
    if quant in ("bf16", "fp8"):
        candidates.append(("W4A8 checkpoint", _with(cfg, model__quantization="w4a8"), gpu))
    if (gpu or cfg.cluster.gpu) != "H200":
        candidates.append(("H200 nodes", _with(cfg, cluster__gpu="H200", cluster__gpu_memory_gb=None), None))
    if cfg.cluster.num_nodes >= 2:
        span = {"count": 1, "tp": per_node * 2, "nnodes": 2}
        pipe = {"count": 1, "tp": per_node, "nnodes": 2, "pp": 2}
        for label, group in ((f"aggregated TP{per_node * 2} over both nodes", span),
                             (f"aggregated TP{per_node}xPP2 over both nodes", pipe)):
            candidates.append((label, _with(cfg, layout={"mode": "aggregated", "aggregated": [group]}), gpu))
    found = []
    for label, option, option_gpu in candidates:
        if option is None:
            continue
        report = check_layout_fits(option, gpu=option_gpu, suggest=False)
        if report.fits:
            worst = max(report.groups, key=lambda g: g.weights_gb)
            found.append(f"{label} ({worst.weights_gb:.0f} GB/GPU weights, KV {worst.kv_capacity_tokens:,} tokens)")
    return found
