"""SGLang's batch scheduling of one server, without time or tokens: who is admitted, what KV is held, who is retracted.

queue -> [PD decode: pre-allocation] -> admission (chunked prefill budget, KV test) -> running batch
  -> decode steps (one KV slot per request per step; retraction when the pool runs out) -> finished

`BatchSchedule` is the one model of these decisions; steps.py's StepScheduler drives it one forward at a
time for both the planner's virtual-time simulation (plan/simulation/simulate.py) and the simulated engine
(engines/sim/scheduler.py), which add only their clock, so the two cannot drift. Read from SGLang 0.5.17:

- Aggregated (managers/schedule_policy.py PrefillAdder, scheduler_components/new_token_ratio_tracker.py):
  a waiting request is admitted when prompt + min(max_new_tokens, 4096) + page_size is below free KV - the
  running batch's new_token_ratio x remaining output - what this prefill batch already admitted (charged
  its prompt + clipped max_new_tokens); new_token_ratio starts at 0.7 and falls by (0.7 - 0.098) / 600 per
  decode step to 0.098.
- PD prefill: the prompt's KV is allocated at admission and held until the transfer ends.
- PD decode (disaggregation/decode.py DecodePreallocQueue.pop_preallocated): a request's KV is
  pre-allocated when the decode takes it, before the prefill computes it (the prefill waits for the
  decode's KV indices). Only the prompt is allocated; admission keeps num_reserved_decode_tokens (512) of
  headroom for every active request: it fits when max(prompt + 512, prompt + clipped max_new_tokens -
  retractable) <= free - max(512 x active, need_single) - what retracted requests need, where retractable
  is the running batch's prompt + output and need_single its largest prompt + clipped max_new_tokens minus
  that. Requests slots: max_running_requests + 1 (+ 2 x max_running_requests when it is set and <= 32).
  Nothing new is pre-allocated while retracted requests wait; they resume (KV back from host memory, no
  prefill) when their prompt + output + 512 fits.
- A decode step needs one KV slot per running request; when the pool is short, SGLang retracts the
  requests with the fewest output tokens, then the longest prompt, keeping at least one. Aggregated:
  they return to the front of the queue and prefill prompt + output again, and new_token_ratio becomes
  min(1, (decoded + 20 x running) / (sum of max_new_tokens + 1)). PD decode: they wait as retracted.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from orchestrator.perfmodel.scheduling.limits import (
    NewTokenRatio, Seq, ServerLimits, clipped,
)

class BatchSchedule:
    """One server's queues and KV pool, advanced by its caller one forward at a time.

    Prefill forward: next_prefill() -> prefill_done(). Decode forward: admit_transferred() (PD decode),
    before_decode() (retraction) -> decode_done(). PD decode also: enqueue_prealloc() + pop_preallocated().
    """

    def __init__(self, limits: ServerLimits):
        if limits.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens={limits.kv_capacity_tokens}: the weights leave no KV cache")
        self.limits = limits
        self.waiting: deque[Seq] = deque()  # to prefill; PD decode: transferred, waiting to join
        self.chunking: list[Seq] = []  # requests whose prompts span several prefill batches (one per DP rank at most)
        self.prefilling: list[tuple[Seq, int]] = []  # (request, new tokens) of the forward in flight
        self.running: list[tuple[int, int, Seq]] = []  # heap of (finish step, id, request)
        self.prealloc_queue: deque[Seq] = deque()  # PD decode: waiting for pre-allocation
        self.preallocated = 0  # PD decode: pre-allocated, not yet running (in transfer or waiting)
        self.retracted_queue: deque[Seq] = deque()  # PD decode: retracted, KV offloaded
        self.kv_used = 0  # KV slots held (running requests' slots up to this step included)
        self.running_context = 0  # prompt + output of the running batch
        self.remaining_total = 0  # output the running batch may still generate
        self.ratio = NewTokenRatio()
        self.step = 0  # decode steps
        self.forwards = 0  # prefill and decode forwards ended
        self.retracted = 0  # retractions so far
        self._ids = itertools.count(1)
        self._single: list[tuple[int, int, Seq]] = []  # PD decode: max-heap of -(prompt + clipped max_new)

    # ----- views -------------------------------------------------------------------------------------
    @property
    def chunked(self) -> Seq | None:
        """The first request whose prompt spans several prefill batches (None when none does)."""
        return self.chunking[0] if self.chunking else None

    def generated(self, seq: Seq) -> int:
        """Output tokens `seq` holds now (its join count plus the decode steps since it joined)."""
        return seq.output + (self.step - seq.join_step if seq.state == "running" else 0)

    def kv_free(self) -> int:
        return self.limits.kv_capacity_tokens - self.kv_used

    def running_seqs(self) -> list[Seq]:
        return [entry[2] for entry in self.running]

    def idle(self) -> bool:
        return not (self.waiting or self.chunking or self.prefilling or self.running or self.prealloc_queue
                    or self.retracted_queue)

    # ----- queues ------------------------------------------------------------------------------------
    def submit(self, seq: Seq) -> None:
        """A request to prefill (aggregated, PD prefill) or, on a PD decode, one whose KV has landed."""
        seq.seq_id = seq.seq_id or next(self._ids)
        seq.state = "waiting"
        self.waiting.append(seq)

    def enqueue_prealloc(self, seq: Seq) -> None:
        """PD decode: a new request waits for its KV pre-allocation (it is transferred only after)."""
        seq.seq_id = next(self._ids)
        seq.state = "prealloc"
        self.prealloc_queue.append(seq)

    def pop_preallocated(self) -> list[Seq]:
        """PD decode: resume retracted requests that fit, then pre-allocate queued ones in order (FIFO)."""
        lim = self.limits
        if self.retracted_queue:
            budget = self._allocatable(count_retracted=False)
            while self.retracted_queue and self._slots_free():
                seq = self.retracted_queue[0]
                if seq.fill + lim.reserved_decode_tokens > budget:
                    break
                self.retracted_queue.popleft()
                budget -= seq.fill + lim.reserved_decode_tokens
                self._allocate(seq, seq.fill)
                seq.state = "waiting"
                self.preallocated += 1
                self.waiting.append(seq)
            if self.retracted_queue:
                return []
        out: list[Seq] = []
        while self.prealloc_queue and self._slots_free():
            seq = self.prealloc_queue[0]
            retractable = self.running_context
            need = max(seq.fill + lim.reserved_decode_tokens, seq.fill + clipped(seq.max_new_tokens) - retractable)
            if need > self._allocatable(count_retracted=True):
                break
            self.prealloc_queue.popleft()
            self._allocate(seq, seq.fill)
            seq.state = "transfer"
            self.preallocated += 1
            out.append(seq)
        return out

    def _slots_free(self) -> bool:
        return len(self.running) + self.preallocated < self.limits.decode_request_slots

    def _allocatable(self, count_retracted: bool) -> int:
        lim = self.limits
        active = len(self.running) + self.preallocated
        single = retracted = 0  # new requests only: see SGLang's _allocatable_token_budgets
        if count_retracted:
            while self._single and self._single[0][2].state != "running":
                heapq.heappop(self._single)  # left the running batch since it was pushed
            if self._single:  # room for the largest running request to finish if every other one retracts
                single = -self._single[0][0] - self.running_context
            retracted = sum(s.fill + lim.reserved_decode_tokens for s in self.retracted_queue)
        return self.kv_free() - max(lim.reserved_decode_tokens * active, single) - retracted

    def admit_transferred(self) -> list[Seq]:
        """PD decode: requests whose KV landed (or came back from host memory) join the running batch, in
        order, up to max_running; a new one holds its first token (sampled by the prefill)."""
        out: list[Seq] = []
        while self.waiting and len(self.running) < self.limits.max_running:
            seq = self.waiting.popleft()
            self.preallocated -= 1
            self._join(seq, new_token=seq.output == 0)  # a resumed request has its tokens already
            out.append(seq)  # state 'done' when the transferred first token was its last
        return out

    # ----- prefill ------------------------------------------------------------------------------------
    def next_prefill(self, cached_tokens=None, max_new_requests: int | None = None) -> list[tuple[Seq, int]]:
        """The next prefill forward: (request, new tokens) within the chunk budget; admits waiting requests.

        `cached_tokens(seq)`: leading prompt tokens found in a prefix cache when a request is admitted;
        `max_new_requests`: admit at most this many waiting requests (continuing chunks are not counted)."""
        lim = self.limits
        budget = lim.chunked_prefill_tokens
        per_request = max(1, budget // lim.prefill_ranks)  # one rank's chunk
        batch: list[tuple[Seq, int]] = []
        continuing, self.chunking = self.chunking, []
        for seq in continuing:
            take = min(seq.fill - seq.prefilled, budget, per_request)
            if take > 0:
                batch.append((seq, take))
                budget -= take
            if seq.prefilled + take < seq.fill:
                self.chunking.append(seq)
        if len(self.chunking) >= lim.prefill_ranks:
            budget = 0  # every rank continues a chunked prompt
        charged = 0  # this batch's admissions: prompt + clipped max_new_tokens each (SGLang's PrefillAdder)
        admitted = 0
        while self.waiting and budget > 0 and (max_new_requests is None or admitted < max_new_requests):
            seq = self.waiting[0]
            if len(self.running) + len(batch) >= lim.max_running:
                break
            # (PD prefill: max_new_tokens 1 and no running batch, so this is prompt + 1 + a page < free)
            need = seq.fill + clipped(seq.max_new_tokens - seq.output) + lim.page_size
            if need >= self.kv_free() - self.ratio.current * self.remaining_total - charged:
                break
            charged += clipped(seq.max_new_tokens - seq.output)  # its fill is allocated just below
            self.waiting.popleft()
            admitted += 1
            self._allocate(seq, seq.fill)
            seq.state = "prefill"
            if cached_tokens is not None and seq.prefilled == 0:  # SGLang computes at least the last token
                seq.prefilled = min(cached_tokens(seq), seq.fill - 1)
            take = min(seq.fill - seq.prefilled, budget, per_request)
            batch.append((seq, take))
            budget -= take
            if seq.prefilled + take < seq.fill:
                self.chunking.append(seq)
                if len(self.chunking) >= lim.prefill_ranks:
                    break
        self.prefilling = batch
        return batch

    def prefill_done(self) -> list[Seq]:
        """End of the prefill forward: the requests whose whole prompt is now computed, in batch order.

        Aggregated: each has its next token and joins the running batch (state 'running'), or is done when
        that was its last ('done'). PD prefill: each holds its KV for the transfer ('held') until release()."""
        batch, self.prefilling = self.prefilling, []
        self.forwards += 1
        out: list[Seq] = []
        for seq, take in batch:
            if seq.state != "prefill":  # finished (aborted) while the forward ran
                continue
            seq.prefilled += take
            if seq.prefilled < seq.fill:
                continue
            if self.limits.role == "prefill":
                seq.output, seq.state, seq.first_token_forward = 1, "held", self.forwards
            else:
                self._join(seq, new_token=True)
            out.append(seq)
        return out

    # ----- decode -------------------------------------------------------------------------------------
    def before_decode(self) -> list[Seq]:
        """The next decode step needs one KV slot per running request: retract until it fits (SGLang's order)."""
        if not self.running:
            return []
        if self.kv_free() >= len(self.running):
            if self.limits.role == "aggregated":
                self.ratio.decay_step()
            return []
        order = sorted(self.running_seqs(), key=lambda s: (self.generated(s), -s.prompt_len))
        out: list[Seq] = []
        for seq in order:
            if self.kv_free() >= len(self.running) - len(out) or len(out) == len(self.running) - 1:
                break
            self._leave_running(seq)
            self.kv_used -= seq.kv_tokens  # aggregated: dropped, prefilled again; PD decode: offloaded to host
            seq.kv_tokens, seq.retractions = 0, seq.retractions + 1
            seq.fill, seq.prefilled = seq.prompt_len + seq.output, 0
            out.append(seq)
        gone = set(map(id, out))
        self.running = [e for e in self.running if id(e[2]) not in gone]
        heapq.heapify(self.running)
        self.retracted += len(out)
        if self.limits.role == "decode":
            for seq in out:
                seq.state = "retracted"
                self.retracted_queue.append(seq)
        else:
            for seq in reversed(out):
                seq.state = "waiting"
                self.waiting.appendleft(seq)
            decoded = sum(self.generated(s) for s in self.running_seqs())
            max_new = sum(s.max_new_tokens for s in self.running_seqs())
            self.ratio.after_retract(decoded, len(self.running), max_new)
        return out

    def decode_done(self) -> list[Seq]:
        """End of a decode step: every running request has one more token; those at max_new_tokens are done."""
        n = len(self.running)
        self.kv_used += n
        self.running_context += n
        self.remaining_total -= n
        self.step += 1
        self.forwards += 1
        out: list[Seq] = []
        while self.running and self.running[0][0] <= self.step:
            _, _, seq = heapq.heappop(self.running)
            self._leave_running(seq)
            self._free(seq)
            out.append(seq)
        return out

    # ----- ends ---------------------------------------------------------------------------------------
    def finish(self, seq: Seq) -> None:
        """End `seq` early (a stop token, an abort) wherever it is; its KV is freed unless a transfer holds it."""
        state = seq.state
        if state in ("done", "held", "new"):
            return
        if state == "running":
            self._leave_running(seq)
            self.running = [e for e in self.running if e[2] is not seq]
            heapq.heapify(self.running)
        elif state == "waiting":
            self.waiting.remove(seq)
            if self.limits.role == "decode":
                self.preallocated -= 1
        elif state == "transfer":
            self.preallocated -= 1
        elif state == "prealloc":
            self.prealloc_queue.remove(seq)
        elif state == "retracted":
            self.retracted_queue.remove(seq)
        if seq in self.chunking:
            self.chunking.remove(seq)
        self._free(seq)

    def release(self, seq: Seq) -> None:
        """PD prefill: the transfer ended; the prompt's KV is free."""
        self._free(seq)

    # ----- bookkeeping --------------------------------------------------------------------------------
    def _allocate(self, seq: Seq, tokens: int) -> None:
        grow = tokens - seq.kv_tokens
        seq.kv_tokens = tokens
        self.kv_used += grow

    def _free(self, seq: Seq) -> None:
        self.kv_used -= seq.kv_tokens
        seq.kv_tokens = 0
        seq.state, seq.done_forward = "done", self.forwards

    def _join(self, seq: Seq, new_token: bool) -> bool:
        """`seq` has its next token (from a prefill, or from the transfer); False when that was its last."""
        if new_token:
            if seq.first_token_forward is None:
                seq.first_token_forward = self.forwards
            seq.output += 1
            self._allocate(seq, seq.kv_tokens + 1)
        remaining = seq.max_new_tokens - seq.output
        if remaining <= 0:
            self._free(seq)
            return False
        seq.state, seq.join_step = "running", self.step
        self.running_context += seq.prompt_len + seq.output
        self.remaining_total += remaining
        heapq.heappush(self.running, (self.step + remaining, seq.seq_id, seq))
        if self.limits.role == "decode":
            heapq.heappush(self._single, (-(seq.prompt_len + clipped(seq.max_new_tokens)), seq.seq_id, seq))
        return True

    def _leave_running(self, seq: Seq) -> None:
        """Fold the decode steps `seq` took into its own counts before it leaves the running batch."""
        done = self.generated(seq)
        self.running_context -= seq.prompt_len + done
        self.remaining_total -= seq.max_new_tokens - done
        seq.kv_tokens += done - seq.output
        seq.output = done
        seq.state = "left"

