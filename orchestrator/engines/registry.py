"""engine.kind -> EngineBackend: the one place that knows every engine (imports the backends; they import only base)."""

from __future__ import annotations

from orchestrator.config import RunConfig
from orchestrator.engines.base import EngineBackend
from orchestrator.engines.sglang.launch import SglangBackend
from orchestrator.engines.sim.backend import SimBackend

BACKENDS: dict[str, type[EngineBackend]] = {"sim": SimBackend, "sglang": SglangBackend}


def backend_for(cfg: RunConfig) -> EngineBackend:
    """The backend of cfg.engine.kind."""
    return BACKENDS[cfg.engine.kind]()
