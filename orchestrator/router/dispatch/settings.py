"""The dispatcher's knobs (DispatchSettings, from the run config's `router` section) and its default leg timeout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Used when neither router.request_timeout_s nor a run deadline bounds a request (HTTP ingress).
DEFAULT_REQUEST_TIMEOUT_S = 600.0


@dataclass
class DispatchSettings:
    """Knobs of the dispatcher; `from_router_config` maps the run config's `router` section."""

    policy: str = "prefix_aware"
    seed: int | None = None  # of the drawing policies (random, power_of_two); None = unseeded
    request_timeout_s: float | None = None  # per leg; None = time left before the deadline
    max_attempts: int = 2
    suspect_s: float = 10.0  # how long a failed worker is avoided
    backoff_s: float = 0.05  # before retry n: backoff_s * 2**(n-1)
    abort_timeout_s: float = 2.0
    prefill_grace_s: float = 5.0  # how long a prefill leg may lag behind its finished decode
    health_timeout_s: float = 5.0
    unhealthy_after_failures: int = 3  # consecutive failed /health probes
    max_connections: int = 2048  # pooled; hundreds of requests in flight, two legs each

    @classmethod
    def from_router_config(cls, router: Any) -> "DispatchSettings":
        return cls(
            policy=router.policy, seed=router.seed, request_timeout_s=router.request_timeout_s, max_attempts=router.max_attempts
        )
