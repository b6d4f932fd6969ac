"""KV layout for transfer tests: MLA-shaped pages per layer (page_size x latent dims x dtype bytes)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config import RunConfig
from orchestrator.config.server_spec import KV_DTYPE_BYTES


@dataclass(frozen=True)
class KvLayout:
    """How the KV pool is cut into NIXL descriptors: one per page per layer."""

    num_layers: int
    page_bytes: int
    pages_per_layer: int

    @property
    def num_descriptors(self) -> int:
        return self.num_layers * self.pages_per_layer

    @property
    def total_bytes(self) -> int:
        return self.num_descriptors * self.page_bytes

    @classmethod
    def for_config(cls, cfg: RunConfig, target_bytes: int) -> "KvLayout":
        arch = cfg.model.architecture()
        dtype = cfg.engine.sglang.kv_cache_dtype
        if dtype not in KV_DTYPE_BYTES:
            raise PreflightError(
                f"engine.sglang.kv_cache_dtype={dtype!r} has no known element size; use one of {sorted(KV_DTYPE_BYTES)}"
            )
        page = cfg.engine.sglang.page_size * arch.kv_elems_per_token_per_layer * KV_DTYPE_BYTES[dtype]
        pages = max(1, target_bytes // (page * arch.num_hidden_layers))
        return cls(num_layers=arch.num_hidden_layers, page_bytes=page, pages_per_layer=pages)


class PreflightError(RuntimeError):
    """The transfer could not be set up or did not deliver the right bytes; the message says what failed."""
