"""Imported by every Python process of the probe's SGLang server (this folder leads PYTHONPATH): records the
routed experts each MoE layer call picks, and optionally replaces every MoE gate after the dummy load.

PDO_PROBE_TRACE=<file.jsonl>  one line per select_experts call outside CUDA-graph capture: layer, tokens,
                              distinct routed experts (ids < n_routed_experts; fused shared-expert slots and
                              padding dropped). Eager servers only: a replayed CUDA graph runs no Python.
PDO_PROBE_GATE=random         after DummyModelLoader.load_model: every router gate's weight ~ N(0, PDO_PROBE_GATE_STD,
                              default 0.02) and its e_score_correction_bias zeroed - routing that varies per
                              token like a real checkpoint's (the "randomised gate"), with every other weight dummy.
                              A router gate is DeepSeek's MoEGate or Qwen2/3-MoE's linear router (a ReplicatedLinear
                              named `mlp.gate`, no bias).
Stdlib + torch (present on the GPU machine); does nothing unless one of the two variables is set.
"""

import importlib.abc
import importlib.util
import json
import os
import sys

TRACE = os.environ.get("PDO_PROBE_TRACE", "")
GATE = os.environ.get("PDO_PROBE_GATE", "")
GATE_STD = float(os.environ.get("PDO_PROBE_GATE_STD", "0.02"))


def patch_topk(mod, trace_path: str) -> None:
    """Wrap mod.select_experts (TopK.forward_* look it up as a module global at every call)."""
    original = mod.select_experts

    def select_experts(hidden_states, router_logits, topk_config, *args, **kwargs):
        out = original(hidden_states, router_logits, topk_config, *args, **kwargs)
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                return out
            ids = out.topk_ids
            n = int(router_logits.shape[-1])
            ids = ids[(ids >= 0) & (ids < n)]
            row = {"layer": kwargs.get("layer_id"), "tokens": int(router_logits.shape[0]),
                   "distinct": int(torch.unique(ids).numel()), "experts": n, "pid": os.getpid()}
            with open(trace_path, "a") as f:
                f.write(json.dumps(row) + "\n")
        except Exception as exc:  # the probe must not change what the server does
            print(f"pdo probe trace: {type(exc).__name__}: {exc}", file=sys.stderr)
        return out

    mod.select_experts = select_experts


def is_router_gate(name: str, module) -> bool:
    """DeepSeek's MoEGate, or a Qwen2/3-MoE router: the ReplicatedLinear at `<layer>.mlp.gate`."""
    kind = type(module).__name__
    return kind == "MoEGate" or (kind == "ReplicatedLinear" and name.endswith("mlp.gate"))


def randomise_gates(model, std: float) -> int:
    """Every router gate: weight ~ N(0, std), correction bias 0 (in place: the routing config keeps its reference)."""
    import torch

    done = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            if not is_router_gate(name, module):
                continue
            module.weight.normal_(0.0, std)
            bias = getattr(module, "e_score_correction_bias", None)
            if bias is not None:
                bias.zero_()
            done += 1
    return done


def patch_loader(mod, std: float) -> None:
    original = mod.DummyModelLoader.load_model

    def load_model(self, *args, **kwargs):
        model = original(self, *args, **kwargs)
        print(f"pdo probe: randomised {randomise_gates(model, std)} MoE gates (std {std})", file=sys.stderr)
        return model

    mod.DummyModelLoader.load_model = load_model


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch right after a named module finishes importing."""

    def __init__(self, patches):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module, patch = spec.loader.exec_module, self.patches[name]

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]  # this one loader, this one module
        return spec


_patches = {}
if TRACE:
    _patches["sglang.srt.layers.moe.topk"] = lambda m: patch_topk(m, TRACE)
if GATE == "random":
    _patches["sglang.srt.model_loader.loader"] = lambda m: patch_loader(m, GATE_STD)
if _patches:
    sys.meta_path.insert(0, _AfterImport(_patches))
