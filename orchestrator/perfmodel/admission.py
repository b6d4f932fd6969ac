"""SGLang's admission of new requests into a running batch, and its retraction when the KV pool runs out.

One model shared by the planner's simulation (plan/simulate.py) and anything else that schedules like
SGLang. Read from SGLang 0.5.17 (managers/schedule_policy.py PrefillAdder.add_one_req,
scheduler_components/new_token_ratio_tracker.py, managers/schedule_batch.py retract_decode) and 0.4.10
(the same rules, in scheduler.py / schedule_policy.py):

- a waiting request is admitted when prompt + min(max_new_tokens, 4096) + page_size is below
  free KV - sum over running requests of new_token_ratio x their remaining max_new_tokens: the running
  batch is charged only a ratio of what it may still generate (optimistic);
- new_token_ratio starts at 0.7 (SGLANG_INIT_NEW_TOKEN_RATIO x schedule_conservativeness 1.0) and falls
  by (0.7 - 0.7 x 0.14) / 600 per decode step without retraction, to 0.098;
- when a decode step does not fit the KV pool, requests are retracted (fewest output tokens first,
  then the longest prompt) until it fits; they return to the queue and later prefill prompt + their
  output so far again; the ratio becomes min(1, (decoded + 20 x running) / (sum of max_new_tokens + 1)).
"""

from __future__ import annotations

from dataclasses import dataclass

CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS


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


def admits(
    fill_tokens: int,
    remaining_new_tokens: int,
    capacity: int,
    occupied: int,
    running_remaining_total: int,
    ratio: float,
    page_size: int = 1,
) -> bool:
    """SGLang's test for one waiting request: fill + remaining output (+ a page) < the optimistic free KV."""
    need = fill_tokens + min(remaining_new_tokens, CLIP_MAX_NEW_TOKENS) + page_size
    free = capacity - occupied - ratio * running_remaining_total
    return need < free
