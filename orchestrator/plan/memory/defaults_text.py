"""What each group's servers take from SGLang's own defaults (the flags their ServerSpec leaves unset), as `plan` prints
it."""

from __future__ import annotations

from orchestrator.config import RunConfig
from orchestrator.config.server_spec import server_spec
from orchestrator.config.sglang_versions import release_for
from orchestrator.perfmodel.costmodel import EngineCostModel, cost_model_of_spec


def _graph_max_bs_text(model: EngineCostModel) -> str | None:
    """The decode graph max SGLang resolves, and where its request pool stops the capture below it."""
    if model.graph_max_bs == 0:
        return None
    if model.captured_graph_max_bs < model.graph_max_bs:
        return f"{model.graph_max_bs} (captured to {model.captured_graph_max_bs}: the request pool, max_running_requests)"
    return str(model.graph_max_bs)


def sglang_defaults_text(cfg: RunConfig, gpu: str | None = None) -> str:
    """What each group's servers take from SGLang's own defaults: the flags its ServerSpec leaves unset, valued as
    engine.sglang.version derives them on `gpu` (the table of config/sglang_versions.py, perfmodel/sglang_defaults)."""
    version = cfg.engine.sglang.version
    release = release_for(version)
    table = "" if release.version == version else f", the {release.version} table"
    lines = [f"SGLang {version} defaults (engine.sglang.version{table}) for the flags left unset:"]
    for role, i, group in cfg.layout.groups():
        spec = server_spec(cfg, role, group)
        model = cost_model_of_spec(cfg, spec, gpu=gpu or cfg.cluster.gpu)
        unset = {
            "chunked_prefill_size": (spec.batching.chunked_prefill_size, model.chunked_prefill_tokens),
            "mem_fraction_static": (spec.memory.mem_fraction_static, model.mem_fraction_static),
            "cuda_graph_max_bs": (spec.batching.cuda_graph_max_bs, _graph_max_bs_text(model)),
            "max_running_requests": (spec.batching.max_running_requests, model.max_running()),
        }
        shown = [f"{name} {value}" for name, (given, value) in unset.items() if given is None and value is not None]
        lines.append(f"  layout.{role}.{i}: " + (", ".join(shown) or "every such flag is set"))
    lines.append(f"  ({release.version}: {release.defaults_note})")
    return "\n".join(lines)
