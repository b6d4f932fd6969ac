"""One request in flight on the simulated engine (Run): its item, its scheduler request, the task driving its phases
and how it ended; engine.py starts and finishes runs, pd_legs.py drives a PD run's transfer, the HTTP routes answer
from them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from orchestrator.engines.sim.requests import IncrementalText, Item
from orchestrator.engines.sim.sim_request import SimRequest


@dataclass(eq=False)
class Run:
    """One item in flight: its scheduler request, the task driving its PD phases, and its end."""

    item: Item
    req: SimRequest
    streaming: bool
    done: asyncio.Event = field(default_factory=asyncio.Event)
    error: tuple[int, str] | None = None  # (HTTP status, message) when it failed
    final_reason: dict | None = None  # overrides the scheduler's (PD prefill: length 0)
    cached_tokens: int = 0
    submitted: bool = False
    task: asyncio.Task | None = None
    detok: IncrementalText = field(default_factory=IncrementalText)

    @property
    def finish_reason(self) -> dict | None:
        if self.error is not None:
            return {"type": "abort", "message": self.error[1], "status_code": self.error[0], "err_type": None}
        return self.final_reason or self.req.finish_reason
