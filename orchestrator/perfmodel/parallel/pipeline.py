"""Pipeline parallelism with micro-batches, as SGLang runs it (--pp-size): pp micro-batch slots that follow each
other through the pp stages in lockstep.

SGLang's PP loop is "a non-overlap scheduler loop" (managers/scheduler_pp_mixin.py, event_loop_pp, 0.4.8 on):
every stage, for every micro-batch slot in turn, schedules it, runs its forward, and then blocks on matched
send/recv exchanges with its neighbours (the requests, the hidden states onward, the sampled tokens back). So
each stage iteration pays the scheduler's CPU work and those exchanges in series with its forward; the overlap
scheduler that hides them without PP is off.

- Decode: a round (every running request advances one token) sends each of m = min(pp, batch) micro-batches
  (batch / m requests) once around the ring of stages (the last stage's sampled tokens go back to the first). A
  micro-batch's own trip is every stage's iteration in turn; a stage runs all m micro-batches per round, one at a
  time, and a stage waits on its blocking recv for the one before it. So a round lasts the longer of the two: the
  sum of the stage iterations (one request: the micro-batch crosses the stages one after the other) and m of the
  slowest stage's iterations (pp micro-batches: the slowest stage is always busy and the others wait on it).
- Prefill: a chunk's stage iterations pipeline behind the chunks that follow it. A chunk with another chunk
  waiting behind it costs the slowest stage's iteration (the next fills the pipeline); the last chunk of a
  stream (a lone chunk) drains through every stage: with equal stages k chunks cost k + pp - 1 iterations
  (GPipe's bubble with m = k).

Each stage's time is perfmodel/server/forward.py's forward over that stage's own layers (SGLang's layer split,
StageWeights.stage_layers: R1 at PP 2 is 30 then 31 layers, the dense ones and the embedding on the first, the
lm_head on the last) at the shape the layout gives one GPU; the iteration cost is measured (below); nothing is
fitted to a throughput row.
"""

from __future__ import annotations

from collections.abc import Sequence

# One stage iteration's fixed cost and its cost per request of the micro-batch, beyond the stage's forward: the
# least-squares fit of round = pp x (stage(B / m) + ITERATION_S + ITERATION_PER_REQUEST_S x B / m) on the six PP2
# decode points (batch 1-256, 256-token prompts, CUDA graphs) of two H200s,
# benchmarks/results/2026-11-26-two-gpu-h200x2/call1-calibration/calibration-twogpu.json.xz, with the stage forward
# the H200 R1-shaped profile's; derivation and residuals (RMS 6 %): benchmarks/pp_round_cost.py, output in
# benchmarks/results/2026-11-26-pp-round-cost/output.txt. That run's PP2 rows are in-sample since. Kept when each stage
# got its own layers (hpp): on the per-stage forwards the RMS is 6.0 % (benchmarks/results/2026-11-26-pp-stages/pp-round-cost/).
ITERATION_S = 2.62e-3
ITERATION_PER_REQUEST_S = 13.3e-6


def micro_batches(batch_size: int, pp: int) -> int:
    """How many micro-batches a running batch forms (each holds at least one request)."""
    return max(1, min(pp, batch_size))


def iteration_s(requests: int) -> float:
    """A stage iteration's scheduler work and blocking exchanges for a micro-batch of `requests` requests."""
    return ITERATION_S + ITERATION_PER_REQUEST_S * max(0, requests)


def decode_round_s(stage_s: Sequence[float], micro_batches: int, micro_batch_requests: int) -> float:
    """One decode round of `micro_batches` micro-batches of `micro_batch_requests` requests over stages whose forwards
    of one micro-batch are `stage_s`: the longer of a micro-batch's trip through every stage and the slowest stage's
    iterations for all of them (equal stages: pp x (stage + iteration))."""
    iterations = [s + iteration_s(micro_batch_requests) for s in stage_s]
    return max(sum(iterations), micro_batches * max(iterations))


def prefill_chunk_s(stage_s: Sequence[float], requests: int, chunk_follows: bool) -> float:
    """One prefill chunk of `requests` requests through stages whose forwards of it are `stage_s`: the slowest stage's
    iteration when another chunk waits behind it, every stage's when it is the last (or only) one."""
    iterations = [s + iteration_s(requests) for s in stage_s]
    return max(iterations) if chunk_follows else sum(iterations)
