"""One server's step loop without a clock: which forward runs next, what it costs, and what it produced.

caller's clock: schedule() -> Step (PD decode hand-offs, then the next forward and its modelled seconds)
  -> run it for Forward.duration_s (virtual or paced wall time) -> update_from_output(step) -> finished requests

`StepScheduler` is the one copy of "which forward runs next", as vLLM's scheduler interface splits it
(schedule() returns what the next forward runs, update_from_output() applies what it produced). The
planner's virtual-time simulation (plan/simulation/simulate.py) and the simulated engine (engines/sim/scheduler.py)
each drive one per server and keep only their clock, tokens and transport. What one turn does, as SGLang
0.5.17's event loop (managers/scheduler.py, disaggregation/decode.py) does it:

- PD decode, every turn (process_decode_queue): pre-allocate KV for queued requests (their prefill may
  start now: the caller hands them off) and admit the requests whose KV has landed into the running batch.
  A request whose KV needs no transfer (a warm-up, a health probe, the planner's decode-only trace:
  SGLang's fake transfer) is there as soon as it is pre-allocated.
- Aggregated and PD prefill: a prefill batch when one can be admitted (chunked prefill budget, KV test;
  SGLang's default runs a waiting prefill before the next decode step, no mixed chunks).
- Otherwise (not a PD prefill): retract if the next decode step needs more KV than is free, then one decode
  step of the running batch.
Admission, KV and retraction are admission.py's BatchSchedule; step times are the cost model's
(prefill_time_s of the chunk's new and cached tokens, decode_step_s of the batch, its context and, where its requests
name them, their greedy chains: on dummy weights requests whose prompts end in the same token decode alike and route
as at most two tokens, perfmodel/weights.decode_routing_tokens).

A prefill launched kernel by kernel (no prefill CUDA graph: every MLA model on SGLang 0.5.17) cannot end before the
scheduler's thread has launched its last kernel (the cost model's prefill_launch_s). SGLang's overlap loop launches a
forward while the previous one still runs on the GPU (managers/scheduler.py, event_loop_overlap: run_batch of the
next batch before process_batch_result of the last), so a prefill that follows another forward is charged its GPU
work only, as before; one that starts on an idle server (a lone prompt) or in a loop that does not overlap
(`overlap_launch` False: --disable-overlap-schedule) lasts max(GPU work, launch). How much of a launch the previous
forward hides under load (its GPU time beyond its own launch) is not charged: docs/fidelity.md ("The answer floor of
a lone short prompt") gives what charging it would do to the published full-size rows.

An idle server's first prefill holds only the first request of a burst. SGLang's loop spins while idle and schedules a
prefill as soon as one request is waiting (managers/scheduler.py, get_next_batch_to_run); requests a client sends "at
once" reach the scheduler one by one (each its own HTTP connection, tokenizer manager, ZMQ hop), so the rest of the
burst waits for that first forward. Every burst in the two-GPU calibration logs starts so (#new-seq: 1 in the first
Prefill batch line of each k-prompt point: TP 2, DP-attention 2 + EP 2; docs/fidelity.md, "DP-attention 2 + EP2 rows,
term by term"). With DP attention this puts the ranks out of phase: the first rank's prompt continues its chunk while
the second rank's starts, so a lockstep forward holds one rank's continuation beside the other's fresh chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from orchestrator.perfmodel.scheduling.admission import BatchSchedule
from orchestrator.perfmodel.scheduling.limits import Seq, ServerLimits


class StepCostModel(Protocol):
    """The part of the cost model a step loop needs (orchestrator.perfmodel.costmodel.EngineCostModel)."""

    def prefill_time_s(
        self, new_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None, chunk_follows: bool = False,
    ) -> float: ...

    def decode_step_s(self, batch_size: int, context_tokens: int,
                      greedy_chains: Sequence[Hashable | None] | None = None) -> float: ...

    # optional (a stand-in without it launches nothing): prefill_launch_s(requests) -> float
    # decode_step_s gets `greedy_chains` (each running request's Seq.greedy_chain) only once a request carries one


@dataclass
class Forward:
    """One forward pass: a prefill batch of (request, new tokens) or a decode step of the running batch."""

    kind: Literal["prefill", "decode"]
    duration_s: float  # the cost model's seconds for it (the caller's clock scales or paces them)
    prefill: list[tuple[Seq, int]] = field(default_factory=list)
    running: list[Seq] = field(default_factory=list)  # decode: the batch as it starts (one token each)


@dataclass
class Step:
    """What one turn of the loop decided, in the order it happened."""

    preallocated: list[Seq] = field(default_factory=list)  # PD decode: KV now allocated; their prefill may start
    joined: list[Seq] = field(default_factory=list)  # PD decode: KV landed; first token out ('done': it was the last)
    retracted: list[Seq] = field(default_factory=list)  # left the running batch so the decode step fits
    forward: Forward | None = None  # None: nothing to run until a request arrives, lands or is released


class StepScheduler:
    """One server's loop: queue requests, then alternate schedule() and update_from_output(step)."""

    def __init__(self, limits: ServerLimits, cost: StepCostModel,
                 cached_tokens: Callable[[Seq], int] | None = None, overlap_launch: bool = True):
        """`cached_tokens(seq)`: leading prompt tokens a prefix cache holds when a request is admitted;
        `overlap_launch`: SGLang's overlap loop (a forward is launched while the previous one runs)."""
        self.batch = BatchSchedule(limits)
        self.cost = cost
        self.cached_tokens = cached_tokens
        self.overlap_launch = overlap_launch
        self._idle = True  # the last turn ran nothing: the next forward's launch has nothing to hide behind
        self._kv_local: set[Seq] = set()
        self._chained = False  # some request names its greedy chain: decode steps pass the batch's chains

    @property
    def limits(self) -> ServerLimits:
        return self.batch.limits

    def idle(self) -> bool:
        return self.batch.idle()

    # ----- requests ----------------------------------------------------------------------------------
    def submit(self, seq: Seq) -> None:
        """A request to prefill (aggregated, PD prefill) or, on a PD decode, one whose KV has landed."""
        self._chained |= seq.greedy_chain is not None
        self.batch.submit(seq)

    def enqueue_prealloc(self, seq: Seq, kv_local: bool = False) -> None:
        """PD decode: a new request waits for its KV pre-allocation; `kv_local`: no transfer will bring it."""
        self._chained |= seq.greedy_chain is not None
        self.batch.enqueue_prealloc(seq)
        if kv_local:
            self._kv_local.add(seq)

    def release(self, seq: Seq) -> None:
        """PD prefill: the request's transfer ended; its prompt's KV is free."""
        self.batch.release(seq)

    def finish(self, seq: Seq) -> None:
        """End `seq` early (a stop token, an abort) wherever it is."""
        self._kv_local.discard(seq)
        self.batch.finish(seq)

    # ----- the loop ----------------------------------------------------------------------------------
    def schedule(self) -> Step:
        """One turn: the hand-offs that happen now and the forward to run next (None when there is none)."""
        batch, role, step = self.batch, self.batch.limits.role, Step()
        if role == "decode":
            step.preallocated = batch.pop_preallocated()
            for seq in step.preallocated:
                if seq in self._kv_local:
                    self._kv_local.discard(seq)
                    batch.submit(seq)
            step.joined = batch.admit_transferred()
        else:
            pieces = batch.next_prefill(self.cached_tokens, max_new_requests=1 if self._idle else None)
            if pieces:
                follows = bool(batch.chunking or batch.waiting)  # a pipeline (--pp-size) overlaps it
                seconds = self.cost.prefill_time_s([t for _, t in pieces], [s.prefilled for s, _ in pieces], follows)
                launch = getattr(self.cost, "prefill_launch_s", None)
                if launch is not None and (self._idle or not self.overlap_launch):
                    seconds = max(seconds, launch(len(pieces)))
                step.forward = Forward("prefill", seconds, prefill=pieces)
        if step.forward is None and role != "prefill":
            step.retracted = batch.before_decode()
            if batch.running:
                running = batch.running_seqs()
                if self._chained:  # on dummy weights a chain's requests route alike (weights.decode_routing_tokens)
                    seconds = self.cost.decode_step_s(len(running), batch.running_context,
                                                      greedy_chains=[seq.greedy_chain for seq in running])
                else:
                    seconds = self.cost.decode_step_s(len(running), batch.running_context)
                step.forward = Forward("decode", seconds, running=running)
        self._idle = step.forward is None
        return step

    def update_from_output(self, step: Step) -> list[Seq]:
        """Apply `step`'s forward once it has run: the requests it finished, in order.

        Prefill: those whose whole prompt is now computed (aggregated: their next token is out, state
        'running', or 'done' when it was the last; PD prefill: 'held' for the transfer until release()).
        Decode: those that reached max_new_tokens. Requests finished early while it ran are skipped."""
        if step.forward is None:
            return []
        if step.forward.kind == "prefill":
            return self.batch.prefill_done()
        return self.batch.decode_done()


def burst_prefill(limits: ServerLimits, cost: StepCostModel, prompt_lens: Sequence[int],
                  overlap_launch: bool = True) -> list[Forward]:
    """The prefill forwards an idle server runs for prompts sent at once, each asking for one token: the step loop's
    own chunking, per-rank chunks, first-request-alone and launch rules (what a calibration harness's k-prompt prefill
    point measures)."""
    steps = StepScheduler(limits, cost, overlap_launch=overlap_launch)
    for length in prompt_lens:
        steps.submit(Seq(length, 1))
    forwards: list[Forward] = []
    while (step := steps.schedule()).forward is not None:
        forwards.append(step.forward)
        steps.update_from_output(step)
    return forwards
