"""One generation request inside the simulated engine, and the tokens it is given: derived from the prompt alone
(as fixed dummy weights would answer), so every simulated server gives the same prompt the same output."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Sequence

from orchestrator.perfmodel.scheduling.limits import Seq

_MASK64 = (1 << 64) - 1


def prompt_seed(input_ids: Sequence[int]) -> int:
    """A 64-bit seed from the prompt alone, so every server derives the same output for the same prompt."""
    digest = hashlib.blake2b(",".join(map(str, input_ids)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def output_token(seed: int, position: int, vocab_size: int) -> int:
    """Output token at `position` (0 = first): splitmix64 of (seed, position), like fixed dummy weights."""
    z = (seed + (position + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) % vocab_size


def corrupt_token(token: int, vocab_size: int) -> int:
    """A different, still valid, token id (what garbage from a broken KV path looks like: 200, wrong ids)."""
    return (token * 7919 + 104729) % vocab_size if vocab_size > 1 else token


@dataclass(eq=False)
class SimRequest:
    """One generation request as the scheduler tracks it; times are time.monotonic()."""

    rid: str
    input_ids: list[int]
    max_new_tokens: int
    ignore_eos: bool = False
    min_new_tokens: int = 0  # no stop at EOS before this many tokens (SGLang masks EOS until then)
    first_token: int | None = None  # PD decode: sampled by the prefill, arrived with the KV
    corrupt: bool = False
    created_at: float = field(default_factory=time.monotonic)
    cached_tokens: int = 0  # leading prompt tokens found in the server's prefix cache (not computed)
    output_ids: list[int] = field(default_factory=list)
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: dict | None = None
    seq: Seq | None = None  # its state in the scheduling model
    preallocated: asyncio.Event = field(default_factory=asyncio.Event)  # PD decode: its KV is allocated
    updated: asyncio.Event = field(default_factory=asyncio.Event)  # new tokens or finished (streaming)
    finished_event: asyncio.Event = field(default_factory=asyncio.Event)  # finished only (one wake-up)

    def __post_init__(self) -> None:
        self.seed = prompt_seed(self.input_ids)

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)

    @property
    def greedy_chain(self) -> int | None:
        """The token its greedy decode starts from, its prompt's last: on dummy weights the requests whose prompts end
        alike decode alike, and a decode step routes their tokens as one 2-token cycle (the cost model's rule,
        perfmodel/weights.decode_routing_tokens; docs/simulator.md)."""
        return self.input_ids[-1] if self.input_ids else None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def aborted(self) -> bool:
        return self.finish_reason is not None and self.finish_reason.get("type") == "abort"
