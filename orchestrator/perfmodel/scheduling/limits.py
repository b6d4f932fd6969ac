"""What one server's scheduling is bounded by and works on: its limits (role, KV pool, running requests, prefill chunk),
the request as the scheduler sees it, and SGLang's admission constants (admission.py's BatchSchedule applies them).

ServerLimits (from a cost model: server_limits) + Seq (one request's lengths, progress and KV) -> admission.py.
New-token ratio and clipping as SGLang 0.5.17 has them: managers/schedule_policy.py, new_token_ratio_tracker.py.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from orchestrator.records import Role

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
NUM_RESERVED_DECODE_TOKENS = 512  # --num-reserved-decode-tokens
ROLES = ("aggregated", "prefill", "decode")


@dataclass
class NewTokenRatio:
    """SGLang's new_token_ratio: how much of a running request's remaining output admission reserves."""

    init: float = 0.7
    min_factor: float = 0.14
    decay_steps: int = 600
    current: float = 0.7

    def __post_init__(self) -> None:
        self.current = self.init

    @property
    def minimum(self) -> float:
        return self.init * self.min_factor

    def decay_step(self) -> None:
        self.current = max(self.current - (self.init - self.minimum) / self.decay_steps, self.minimum)

    def after_retract(self, decoded: int, running: int, max_new_total: int) -> None:
        self.current = min(1.0, (decoded + RETRACT_DECODE_STEPS * running) / (max_new_total + 1))


def clipped(max_new_tokens: int) -> int:
    return min(max_new_tokens, CLIP_MAX_NEW_TOKENS)


@dataclass(frozen=True)
class ServerLimits:
    """What bounds one server's scheduling: its role, KV pool, running requests and prefill chunk."""

    role: Role
    kv_capacity_tokens: int
    max_running: int
    chunked_prefill_tokens: int
    page_size: int = 1
    max_running_set: bool = False  # --max-running-requests given (PD decode: extra request slots when <= 32)
    dp_size: int = 1  # SGLang's --dp-size (DP-attention ranks x replicas): the <= 32 extra-slot rule is per worker
    reserved_decode_tokens: int = NUM_RESERVED_DECODE_TOKENS
    # DP-attention ranks: each chunks its own requests at chunked_prefill_tokens / ranks (SGLang divides
    # --chunked-prefill-size by the DP size with DP attention, server_args.py), the forward holds all ranks' chunks
    prefill_ranks: int = 1

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role={self.role!r}; allowed: {', '.join(ROLES)}")

    @property
    def decode_request_slots(self) -> int:
        """A PD decode server's request slots: max_running + 1, and 2 x max_running more for requests still in transfer
        when --max-running-requests is given and each DP worker's share (max_running // dp_size) is at most 32
        (SGLang 0.5.17 arg_groups/pd_disaggregation_hook.py sets disaggregation_decode_extra_slots to twice the
        worker's share; each worker's req_to_token pool adds it, mem_cache/kv_cache_configurator.py)."""
        per_worker = self.max_running // max(1, self.dp_size)
        extra = 2 * self.max_running if self.max_running_set and per_worker <= 32 else 0
        return self.max_running + 1 + extra


def server_limits(cost: Any, kv_capacity_tokens: int | None = None) -> ServerLimits:
    """The limits of one server from its cost model (perfmodel/costmodel.py EngineCostModel)."""
    return ServerLimits(
        role=cost.role,
        kv_capacity_tokens=cost.kv_capacity_tokens() if kv_capacity_tokens is None else kv_capacity_tokens,
        max_running=cost.max_running(),
        chunked_prefill_tokens=cost.chunked_prefill_tokens,
        page_size=cost.page_size,
        max_running_set=cost.max_running_requests is not None,
        dp_size=cost.attn_dp * cost.replicas,
        prefill_ranks=cost.attn_dp,
    )


@dataclass(eq=False)
class Seq:
    """One request as the model sees it: lengths, progress and KV slots; `owner` is the caller's request."""

    prompt_len: int
    max_new_tokens: int
    owner: Any = None
    fill: int = 0  # tokens a prefill must hold: the prompt, or prompt + output after a retraction
    prefilled: int = 0  # of fill, computed or found cached
    output: int = 0  # output tokens when it last joined the running batch (see BatchSchedule.generated)
    kv_tokens: int = 0  # KV slots it holds, not counting its decode steps since joining
    join_step: int = 0
    retractions: int = 0
    state: str = "new"  # new | prealloc | transfer | waiting | prefill | running | held | retracted | done
    seq_id: int = 0
    first_token_forward: int | None = None  # the server's forward count when its first token was out
    done_forward: int | None = None  # ... when it ended
    greedy_chain: Hashable | None = None  # the token its greedy decode starts from (None: its own): steps.py

    def __post_init__(self) -> None:
        self.fill = self.fill or self.prompt_len
