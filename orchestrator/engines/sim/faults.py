"""Fault injection for the simulated engine: crash, hang, slow, error rate and corrupt output.

A `FaultSpec` arrives as JSON (`--faults '{...}'` at start, `POST /sim/faults` at run time, or
`engine.sim.faults` in a run config keyed by role or worker name). The server asks its `FaultInjector`
at fixed points (request arrival, scheduler step, KV transfer) what to do; the injector owns the
counters and the one random stream, so a seeded spec gives the same faults on every run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger("orchestrator.engines.sim.server")  # the simulated server's one log


class FaultSpec(BaseModel):
    """What to break, each field independent; the default breaks nothing."""

    model_config = ConfigDict(extra="forbid")

    crash_after_requests: int | None = Field(
        None, ge=0, description="Exit (code 137, no goodbye) when /generate request number N+1 arrives."
    )
    crash_at_s: float | None = Field(
        None, ge=0, description="Exit this many wall seconds after the spec is applied."
    )
    hang: Literal["none", "requests", "transfer"] = Field(
        "none",
        description="requests: /generate, /health and /health_generate never answer; "
        "transfer: a prefill never sends KV (its decode waits for --waiting-timeout-s).",
    )
    hang_after_requests: int = Field(0, ge=0, description="Requests served normally before the hang starts.")
    slow_factor: float = Field(1.0, gt=0, description="Multiply every simulated step and transfer time.")
    error_rate: float = Field(0.0, ge=0, le=1, description="Fraction of /generate requests answered 500.")
    corrupt_rate: float = Field(
        0.0, ge=0, le=1, description="Fraction of requests whose output token ids are wrong (still 200)."
    )
    seed: int = Field(0, description="Seed of the random stream behind error_rate and corrupt_rate.")
    scheduler_error_after_steps: int | None = Field(
        None, ge=0, description="Raise inside the scheduler at forward step N+1 (an engine bug): every request in "
        "flight and every later one fails naming the error, and /health answers 503."
    )


class SimulatedEngineBug(RuntimeError):
    """The scheduler_error_after_steps fault: an exception inside a scheduler step."""


class FaultSpecError(ValueError):
    """A fault spec that does not parse; the message names the field and what is allowed."""


def parse_fault_spec(raw: str | dict[str, Any] | None) -> FaultSpec:
    """JSON text or a dict -> FaultSpec, with errors naming the field and the allowed values."""
    if raw is None or raw == "":
        return FaultSpec()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise FaultSpecError(f"faults: not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(raw, dict):
        raise FaultSpecError(f"faults: expected a JSON object, got {type(raw).__name__}")
    try:
        return FaultSpec.model_validate(raw)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            path = ".".join(str(p) for p in e["loc"])
            if e["type"] == "extra_forbidden":
                problems.append(f"faults.{path}: unknown fault; allowed: {sorted(FaultSpec.model_fields)}")
            else:
                problems.append(f"faults.{path}: {e['msg']} (got {e.get('input')!r})")
        raise FaultSpecError("; ".join(problems)) from None


@dataclass
class RequestFate:
    """What the injector decided for one /generate request."""

    crash: bool = False
    hang: bool = False
    hang_transfer: bool = False  # prefill only: compute, then never send the KV
    error: bool = False
    corrupt: bool = False


@dataclass
class FaultInjector:
    """Applies one FaultSpec; replaced whole when a new spec is posted (counters restart)."""

    spec: FaultSpec = field(default_factory=FaultSpec)
    requests_seen: int = 0
    steps_seen: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.spec.seed)

    @property
    def step_factor(self) -> float:
        return self.spec.slow_factor

    @property
    def hangs_health(self) -> bool:
        """A server hung on requests also leaves its health probes unanswered (SGLang's probe generates)."""
        return self.spec.hang == "requests" and self.requests_seen >= self.spec.hang_after_requests

    def on_step(self) -> None:
        """Count one forward step of the scheduler; raise when the spec says this step fails."""
        due = self.spec.scheduler_error_after_steps
        self.steps_seen += 1
        if due is not None and self.steps_seen > due:
            raise SimulatedEngineBug(f"injected fault scheduler_error_after_steps={due} (forward step {self.steps_seen})")

    def on_request(self) -> RequestFate:
        """Count one /generate request and decide its fate (one draw per rate, in a fixed order)."""
        s = self.spec
        if s.crash_after_requests is not None and self.requests_seen >= s.crash_after_requests:
            return RequestFate(crash=True)
        hanging = self.requests_seen >= s.hang_after_requests
        self.requests_seen += 1
        error = s.error_rate > 0 and self._rng.random() < s.error_rate
        corrupt = s.corrupt_rate > 0 and self._rng.random() < s.corrupt_rate
        return RequestFate(
            hang=hanging and s.hang == "requests",
            hang_transfer=hanging and s.hang == "transfer",
            error=error,
            corrupt=corrupt,
        )

    async def admit_request(self) -> RequestFate:
        """on_request, acted on where the request arrives: a crash ends the process, a hang never answers."""
        fate = self.on_request()
        if fate.crash:
            crash("crash_after_requests")
        if fate.hang:
            await hang_forever()
        return fate

    def describe(self) -> dict[str, Any]:
        return {**self.spec.model_dump(), "requests_seen": self.requests_seen, "steps_seen": self.steps_seen}


def crash(reason: str) -> None:
    """A fault-injected crash: no cleanup, no goodbye, like a killed process (exit code 137)."""
    log.error("simulated crash (%s)", reason)
    logging.shutdown()
    os._exit(137)


async def hang_forever() -> None:
    """A fault-injected hang: the caller never gets an answer (only its own timeout ends the wait)."""
    await asyncio.Event().wait()
