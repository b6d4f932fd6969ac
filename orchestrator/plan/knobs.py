"""The knobs `plan --search` tunes: each an axis of values and how a value edits a config dict.

Knob(name, values, setter) -> apply(data, value) on a RunConfig's model_dump; None is SGLang's default. The
search (search.py) tries each value on the best config so far; base_knobs says what a config already has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config import RunConfig



def _groups(data: dict, roles: Sequence[str]) -> list[dict]:
    return [g for role in roles for g in data["layout"].get(role) or []]


DECODING = ("decode", "aggregated")  # groups that run decode steps (CUDA graphs, batch caps)
PREFILLING = ("prefill", "aggregated")
ALL = ("prefill", "decode", "aggregated")


def _set_groups(roles: Sequence[str], **fields: object) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        for g in _groups(data, roles):
            g.update(fields)
    return apply


def _set_batch_caps(value: int | None) -> Callable[[dict], None]:
    return _set_groups(DECODING, max_running_requests=value, cuda_graph_max_bs=value)


def _set_attention(value: str | None) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        _set_groups(ALL, attention_backend=value)(data)
        if value == "flashmla":  # SGLang runs FlashMLA at page size 64 only
            data["engine"]["sglang"]["page_size"] = 64
    return apply


def _set_page(value: int) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        data["engine"]["sglang"]["page_size"] = value
    return apply


def _set_speculative(value: tuple[int, int] | None) -> Callable[[dict], None]:
    spec = None if value is None else {"algorithm": "NEXTN", "num_steps": value[0], "eagle_topk": 1,
                                       "num_draft_tokens": value[1]}
    return _set_groups(ALL, speculative=spec)


def _set_warmup(value: str) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        data["benchmark"]["warmup"]["policy"] = value
    return apply


@dataclass(frozen=True)
class Knob:
    """One searched axis: its values (None = SGLang's default) and how each value edits a config dict."""

    name: str
    values: tuple
    setter: Callable[[Any], Callable[[dict], None]]  # takes one of `values`
    pd_only: bool = False

    def apply(self, data: dict, value: object) -> None:
        self.setter(value)(data)


KNOBS: tuple[Knob, ...] = (
    Knob("batch_caps", (None, 256, 512, 1024), _set_batch_caps),  # max_running_requests = cuda_graph_max_bs
    Knob("mem_fraction_static", (None, 0.85, 0.88, 0.9, 0.92), lambda v: _set_groups(ALL, mem_fraction_static=v)),
    Knob("chunked_prefill_size", (None, 4096, 16384), lambda v: _set_groups(PREFILLING, chunked_prefill_size=v)),
    Knob("page_size", (1, 64), _set_page, pd_only=True),
    Knob("attention_backend", (None, "triton", "flashmla"), _set_attention),
    Knob("speculative", (None, (1, 2), (3, 4)), _set_speculative),  # R1's MTP: (num_steps, num_draft_tokens)
    Knob("warmup", ("dataset", "sglang", "none"), _set_warmup),
)


def knob_text(knobs: dict[str, object]) -> str:
    """Compact label of non-default knobs, e.g. 'caps=1024 mem=0.9 mtp=3/4'."""
    short = {"batch_caps": "caps", "mem_fraction_static": "mem", "chunked_prefill_size": "chunk",
             "page_size": "page", "attention_backend": "attn", "speculative": "mtp", "warmup": "warmup"}
    parts = []
    for name, value in knobs.items():
        shown = "off" if value is None else f"{value[0]}/{value[1]}" if isinstance(value, tuple) else value
        if name in ("batch_caps", "mem_fraction_static", "chunked_prefill_size", "attention_backend") and value is None:
            shown = "default"
        parts.append(f"{short.get(name, name)}={shown}")
    return " ".join(parts)


def base_knobs(cfg: RunConfig) -> dict[str, object]:
    """The base config's value of each knob, in KNOBS' terms (what 'no change' means)."""
    deciding = [g for r, _, g in cfg.layout.groups() if r in DECODING]
    caps = deciding[0].cuda_graph_max_bs if deciding and deciding[0].cuda_graph_max_bs == deciding[0].max_running_requests else None
    spec = next((g.speculative for _, _, g in cfg.layout.groups() if g.speculative), None)
    first = cfg.layout.groups()[0][2]
    return {
        "batch_caps": caps,
        "mem_fraction_static": first.mem_fraction_static,
        "chunked_prefill_size": first.chunked_prefill_size,
        "page_size": cfg.engine.sglang.page_size,
        "attention_backend": first.attention_backend,
        "speculative": None if spec is None else (spec.num_steps, spec.num_draft_tokens),
        "warmup": cfg.benchmark.warmup.policy,
    }
