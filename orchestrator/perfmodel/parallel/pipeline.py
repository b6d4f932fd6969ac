"""Pipeline parallelism with micro-batches, as SGLang runs it (--pp-size): the running batch is split into
pp micro-batches that follow each other through the pp stages, so in steady state every stage is busy.

- Decode: a round (every running request advances one token) takes pp x the stage time of one micro-batch
  (batch / pp requests over layers / pp layers, its weights, its collectives and one send to the next
  stage); the scheduler's per-step work for one micro-batch overlaps the other micro-batches' stage work
  and shows only where it is longer. With fewer requests than stages there are fewer micro-batches and
  nothing to overlap.
- Prefill: a chunk's stage times pipeline behind each other; with m = pp micro-batches in flight a chunk
  costs (m + pp - 1) / m stage times (the GPipe bubble), plus the scheduler's step.

The stage time itself is perfmodel/timing.py's forward over a stage's share of the layers at the shape the
layout gives one GPU; nothing here is fitted to a published PP run.
"""

from __future__ import annotations


def micro_batches(batch_size: int, pp: int) -> int:
    """How many micro-batches a running batch forms (each holds at least one request)."""
    return max(1, min(pp, batch_size))


def decode_round_s(stage_s: float, pp: int, batch_size: int, step_overhead_s: float) -> float:
    """One decode round of `batch_size` requests over `pp` stages whose stage time (one micro-batch) is `stage_s`."""
    overlap = (micro_batches(batch_size, pp) - 1) * stage_s
    return pp * stage_s + max(0.0, step_overhead_s - overlap)


def bubble_factor(pp: int, in_flight: int | None = None) -> float:
    """Stage times per micro-batch when `in_flight` micro-batches (default pp) fill a pp-stage pipeline."""
    m = in_flight or pp
    return (m + pp - 1) / m


def prefill_chunk_s(stage_s: float, pp: int, step_overhead_s: float) -> float:
    """One prefill chunk through a pp-stage pipeline with pp micro-batches in flight."""
    return stage_s * bubble_factor(pp) + step_overhead_s
