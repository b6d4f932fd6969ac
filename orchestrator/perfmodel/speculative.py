"""Speculative decoding (MTP with R1's own draft layer) as the cost model sees it."""

from __future__ import annotations

from dataclasses import dataclass

# MTP (speculative decoding with R1's own draft layer). Acceptance of the first draft token 0.85 (DeepSeek-V3
# technical report: 85-90 % for the second token). The x0.8 fall per further step (SGLang chains the same layer,
# trained one token ahead only) is an ASSUMPTION with no source or measurement (no run of ours used real weights
# with MTP): 1.85 tokens per verify at (1 step, 2 draft tokens), 2.74 at (3, 4); SGLang's docs report 1.8x
# decode speed at batch 1 and 1.5x at batch 32 on H200 TP8 (docs/basic_usage/deepseek_v3.md). With dummy
# weights the draft and the target are random, so no draft is taken as accepted (the draft cost remains).
MTP_FIRST_ACCEPT = 0.85
MTP_ACCEPT_DECAY = 0.8  # assumption (above); unused with dummy weights, as every contest run has


def mtp_accept_length(num_steps: int, num_draft_tokens: int, dummy_weights: bool) -> float:
    """Mean tokens one verify step emits per request: 1 + sum over drafts of P(every draft so far accepted)."""
    if dummy_weights:
        return 1.0
    total, chain = 1.0, 1.0
    for step in range(min(num_steps, num_draft_tokens - 1)):
        chain *= MTP_FIRST_ACCEPT * MTP_ACCEPT_DECAY**step
        total += chain
    return total


@dataclass(frozen=True)
class Speculative:
    """Speculative decoding as the cost model sees it: draft forwards, tokens verified, tokens accepted."""

    num_steps: int
    num_draft_tokens: int
    accept_length: float
