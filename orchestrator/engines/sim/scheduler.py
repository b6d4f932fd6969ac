"""The simulated engine's scheduler: the shared step loop on paced wall time, plus tokens, prefix cache and aborts.

submit(SimRequest) -> StepScheduler.schedule() (perfmodel/scheduling: the next forward, its modelled
seconds, admission, KV, retraction, PD decode pre-allocation) -> sleep it x time_scale x slow factor
  -> update_from_output() -> tokens out -> finished

Which forward runs next (prefill first, no mixed chunks; a PD decode pre-allocates and admits landed KV
once per turn, as SGLang's DecodePreallocQueue does) is perfmodel/scheduling/steps.py's StepScheduler, the
same object the planner's simulation (plan/simulation/simulate.py) drives on its virtual clock, so the two cannot
drift. What is the engine's own lives here: one asyncio task that paces each forward on the model's
timeline, the tokens, the prefix cache, stop tokens and aborts. Callers wait on `SimRequest.updated` and
read `output_ids` / `finish_reason`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from typing import Callable

from orchestrator.engines.prefix_blocks import PrefixBlocks
from orchestrator.engines.sim.sim_request import SimRequest, corrupt_token, output_token
from orchestrator.perfmodel.scheduling.limits import Seq, ServerLimits
from orchestrator.perfmodel.scheduling.request_bounds import max_new_tokens_allowed, never_preallocated
from orchestrator.perfmodel.scheduling.steps import Step, StepCostModel, StepScheduler
from orchestrator.records import Role

log = logging.getLogger(__name__)

GEN_THROUGHPUT_WINDOW_STEPS = 40  # SGLang's default --decode-log-interval
PREFIX_BLOCK_TOKENS = 16  # the prefix cache's block
MAX_CATCH_UP_S = 2.0  # how far behind the model's timeline a busy host may fall and still catch up (wall s)


@dataclass(frozen=True)
class SchedulerLimits:
    """Capacity, role and pacing of one simulated server."""

    max_running_requests: int
    kv_capacity_tokens: int
    chunked_prefill_tokens: int
    time_scale: float = 1.0
    role: Role = "aggregated"  # aggregated | prefill (KV held until release) | decode (KV pre-allocated)
    page_size: int = 1
    max_running_set: bool = False  # --max-running-requests given
    dp_size: int = 1  # SGLang's --dp-size (PD decode's extra request slots are decided per worker)

    @classmethod
    def of(cls, limits: ServerLimits, time_scale: float) -> SchedulerLimits:
        """The planner's limits of the same server (perfmodel/scheduling server_limits), paced by `time_scale`."""
        return cls(limits.max_running, limits.kv_capacity_tokens, limits.chunked_prefill_tokens, time_scale,
                   limits.role, limits.page_size, limits.max_running_set, limits.dp_size)

    def model_limits(self) -> ServerLimits:
        return ServerLimits(self.role, self.kv_capacity_tokens, self.max_running_requests,
                            self.chunked_prefill_tokens, self.page_size, self.max_running_set,
                            dp_size=self.dp_size)


@dataclass
class SchedulerStats:
    """A snapshot for /metrics and /server_info."""

    num_running_reqs: int
    num_queue_reqs: int
    kv_used_tokens: int
    kv_capacity_tokens: int
    gen_throughput: float
    decode_steps: int
    prefill_batches: int
    modelled_busy_s: float = 0.0  # wall seconds of steps on the model's timeline (x time_scale)
    host_lost_s: float = 0.0  # wall seconds the host fell behind beyond MAX_CATCH_UP_S: time the model did not take
    max_late_s: float = 0.0  # the latest any step started behind the model's timeline

    @property
    def token_usage(self) -> float:
        return self.kv_used_tokens / self.kv_capacity_tokens if self.kv_capacity_tokens else 0.0


class Scheduler:
    """The engine's batching loop: start() it inside a running event loop, then submit() requests."""

    def __init__(
        self,
        cost: StepCostModel,
        limits: SchedulerLimits,
        vocab_size: int,
        eos_token_id: int,
        slow_factor: Callable[[], float] = lambda: 1.0,
        on_finish: Callable[[SimRequest], None] | None = None,
        before_step: Callable[[], None] = lambda: None,
    ):
        if limits.kv_capacity_tokens < 1:
            raise ValueError(
                f"KV capacity is {limits.kv_capacity_tokens} tokens: the model's weights leave no GPU memory "
                "for KV cache at this TP size/quantization; use more GPUs per server or a smaller checkpoint"
            )
        self.limits = limits
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.slow_factor = slow_factor
        self.on_finish = on_finish
        self.before_step = before_step  # the fault injector's hook (scheduler_error_after_steps)
        self.steps = StepScheduler(limits.model_limits(), cost, cached_tokens=self._cached)
        self.batch = self.steps.batch  # the queues and KV pool, read for stats and aborts
        self.prefilling: list[SimRequest] = []  # in the prefill batch that is running now
        self.prefix_cache = PrefixBlocks(PREFIX_BLOCK_TOKENS, max(0, limits.kv_capacity_tokens // PREFIX_BLOCK_TOKENS))
        self.decode_steps = 0
        self.prefill_batches = 0
        self._recent_steps: collections.deque[tuple[float, float, int]] = collections.deque(
            maxlen=GEN_THROUGHPUT_WINDOW_STEPS
        )
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._live: set[SimRequest] = set()  # every unfinished request it was given, wherever the model holds it
        self.failure: str | None = None  # why the loop stopped (a step raised); every request then fails with it
        # pacing (see _sleep_modelled): when the running step ends on the model's timeline; None while idle
        self._timeline_at: float | None = None
        self.modelled_busy_s = 0.0
        self.host_lost_s = 0.0
        self.max_late_s = 0.0

    # ----- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="sim-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    # ----- requests --------------------------------------------------------------------------------------
    @property
    def kv_used_tokens(self) -> int:
        return self.batch.kv_used

    def max_request_tokens(self) -> int:
        """Prompts shorter than this can be admitted: prompt + 1 new token + a page below the KV pool."""
        return self.limits.kv_capacity_tokens - self.limits.page_size - 1

    def never_preallocated(self, prompt_len: int) -> str | None:
        """PD decode: why a prompt's KV (+ --num-reserved-decode-tokens) can never be pre-allocated here, or None
        (request_bounds.never_preallocated, the planner's rule): SGLang leaves such a prompt queued until the
        prefill's bootstrap timeout; we refuse it at once."""
        lim = self.limits.model_limits()
        if not never_preallocated(lim, prompt_len):
            return None
        needed = prompt_len + lim.reserved_decode_tokens
        return (f"The input ({prompt_len} tokens) + {lim.reserved_decode_tokens} reserved decode tokens "
                f"(--num-reserved-decode-tokens) = {needed} tokens exceeds the decode's KV pool "
                f"({lim.kv_capacity_tokens} tokens): its KV can never be pre-allocated. Use a shorter input or a "
                "decode server with a larger KV pool.")

    def _clamp(self, req: SimRequest) -> None:
        # SGLang's init_req_max_new_tokens: prompt + max_new_tokens + a page below the KV pool (one rule, shared
        # with the planner, which refuses what this cuts)
        req.max_new_tokens = max(1, min(req.max_new_tokens, max_new_tokens_allowed(self.limits.model_limits(), req.prompt_len)))

    def submit(self, req: SimRequest) -> None:
        """Queue a request (the caller has checked prompt_len < capacity; max_new_tokens is clamped to fit).

        PD decode: a request whose KV has landed (first_token set, preallocate() done) joins the batch; a
        local one (warm-up, health probe: SGLang's fake transfer) is pre-allocated first, its KV then there.
        After a failure the request ends at once with its cause."""
        if self._refused_after_failure(req) or self._refused_by_the_pool(req):
            return
        if req.seq is None:
            self._clamp(req)
            req.seq = Seq(req.prompt_len, req.max_new_tokens, owner=req, greedy_chain=req.greedy_chain)
            self._live.add(req)
            if self.limits.role == "decode":
                req.first_token = output_token(req.seed, 0, self.vocab_size)
                self.steps.enqueue_prealloc(req.seq, kv_local=True)
                self._wake.set()
                return
        self.steps.submit(req.seq)
        self._wake.set()

    async def preallocate(self, req: SimRequest) -> None:
        """PD decode: wait until the scheduling model pre-allocates the request's KV (before its transfer), or the
        request ends (aborted, or the scheduler failed)."""
        if self._refused_after_failure(req) or self._refused_by_the_pool(req):
            return
        self._clamp(req)
        req.seq = Seq(req.prompt_len, req.max_new_tokens, owner=req, greedy_chain=req.greedy_chain)
        self._live.add(req)
        self.steps.enqueue_prealloc(req.seq)
        self._wake.set()
        await req.preallocated.wait()

    def drop(self, req: SimRequest) -> None:
        """Free what a request that never reached the batch holds (PD decode: cancelled during its transfer)."""
        self._live.discard(req)
        if req.seq is not None and self.failure is None:
            self.steps.finish(req.seq)
            self._wake.set()

    async def release(self, req: SimRequest) -> None:
        """Free a finished PD prefill request's KV, held for its transfer until now."""
        if req.seq is not None and req.seq.state == "held" and self.failure is None:
            self.steps.release(req.seq)
            self._wake.set()

    def _unfinished(self) -> list[SimRequest]:
        b = self.batch
        seqs = [*b.prealloc_queue, *b.waiting, *([b.chunked] if b.chunked else []), *b.running_seqs(),
                *b.retracted_queue]
        return list({id(r): r for r in [*(s.owner for s in seqs), *self.prefilling] if not r.finished}.values())

    def abort(self, rid_prefix: str, abort_all: bool = False, message: str = "Aborted by AbortReq.") -> int:
        """Abort every unfinished request whose rid starts with rid_prefix (SGLang's prefix match)."""
        matched = [r for r in self._unfinished() if abort_all or (bool(rid_prefix) and r.rid.startswith(rid_prefix))]
        for r in matched:
            self._finish(r, {"type": "abort", "message": message})
        return len(matched)

    def abort_request(self, req: SimRequest, message: str = "Aborted by AbortReq.") -> None:
        """Abort exactly this request (the server resolved the rid prefix itself)."""
        self._finish(req, {"type": "abort", "message": message})

    def stats(self) -> SchedulerStats:
        b = self.batch
        return SchedulerStats(
            num_running_reqs=len(b.running) + len({*self.prefilling, *([b.chunked.owner] if b.chunked else [])}),
            num_queue_reqs=len(b.waiting) + len(b.retracted_queue),
            kv_used_tokens=b.kv_used,
            kv_capacity_tokens=self.limits.kv_capacity_tokens,
            gen_throughput=self.gen_throughput(),
            decode_steps=self.decode_steps,
            prefill_batches=self.prefill_batches,
            modelled_busy_s=self.modelled_busy_s,
            host_lost_s=self.host_lost_s,
            max_late_s=self.max_late_s,
        )

    def gen_throughput(self) -> float:
        """Generated tokens per wall second over the last 40 decode steps (SGLang's last_gen_throughput)."""
        if not self._recent_steps:
            return 0.0
        span = self._recent_steps[-1][1] - self._recent_steps[0][0]
        tokens = sum(n for _, _, n in self._recent_steps)
        return tokens / span if span > 0 else 0.0

    def idle(self) -> bool:
        return self.steps.idle() and not self.prefilling

    # ----- the loop --------------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                step = self.steps.schedule()
                self._hand_off(step)
                if step.forward is None:
                    self._timeline_at = None  # idle: the next step starts when work arrives
                    await self._wake.wait()
                    continue
                self.before_step()
                if step.forward.kind == "prefill":
                    await self._run_prefill(step)
                else:
                    await self._run_decode_step(step)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must not leave clients waiting forever, nor spin on the same error
                self._fail(exc)
                return

    def _fail(self, exc: Exception) -> None:
        """Stop after a step raised: every request it was given (found by `_live`: the model's batch may be
        half-updated) and every later one fails with the cause (SGLang's scheduler dies with its server)."""
        log.exception("scheduler step failed; failing every request in flight and every new one")
        self.failure = f"simulated scheduler failed: {type(exc).__name__}: {exc}"
        for req in [*self._live, *self.prefilling]:
            self._finish(req, self.failure_reason())

    def failure_reason(self) -> dict:
        return {"type": "abort", "message": self.failure, "status_code": 500}

    def _refused_by_the_pool(self, req: SimRequest) -> bool:  # the server refuses it earlier (check_item)
        why = None if req.seq is not None else self.never_preallocated(req.prompt_len)
        if why is not None:
            self._finish(req, {"type": "abort", "message": why, "status_code": 400})
        return why is not None

    def _refused_after_failure(self, req: SimRequest) -> bool:
        if self.failure is not None:
            self._finish(req, self.failure_reason())
        return self.failure is not None

    def _hand_off(self, step: Step) -> None:
        """PD decode: pre-allocated requests may start their transfer; landed ones have their first token."""
        for seq in step.preallocated:
            seq.owner.preallocated.set()
        for seq in step.joined:
            req = seq.owner
            if not req.output_ids:  # KV arrived by transfer with the prefill's first token
                req.output_ids.append(req.first_token)
                req.first_token_at = time.monotonic()
                req.updated.set()
            self._after_token(req, last=seq.state == "done")

    def _cached(self, seq: Seq) -> int:
        req: SimRequest = seq.owner
        cached = self.prefix_cache.matched_blocks(self.prefix_cache.chain(req.input_ids), touch=True) * PREFIX_BLOCK_TOKENS
        if seq.retractions == 0:
            req.cached_tokens = min(cached, seq.fill - 1)
        return cached

    async def _sleep_modelled(self, seconds: float) -> None:
        """Let one step take its modelled time, on the model's timeline rather than after our own CPU work.

        A busy server's next step starts when the previous one ended on the model's timeline, so the CPU
        this process spends between steps (tokens, streams, transfers) is absorbed instead of added to every
        step; a host that falls behind catches up by at most MAX_CATCH_UP_S, and the rest is counted in
        `host_lost_s` (the host, not the model, took that time).
        """
        duration = max(0.0, seconds) * self.limits.time_scale * self.slow_factor()
        now = time.monotonic()
        start = now if self._timeline_at is None else self._timeline_at
        late = now - start
        self.max_late_s = max(self.max_late_s, late)
        if late > MAX_CATCH_UP_S:
            self.host_lost_s += late - MAX_CATCH_UP_S
            start = now - MAX_CATCH_UP_S
        self._timeline_at = start + duration
        self.modelled_busy_s += duration
        await asyncio.sleep(max(0.0, self._timeline_at - now))

    async def _run_prefill(self, step: Step) -> None:
        assert step.forward is not None
        self.prefilling = [seq.owner for seq, _ in step.forward.prefill]
        try:
            await self._sleep_modelled(step.forward.duration_s)
        finally:
            self.prefilling = []
        self.prefill_batches += 1
        self._log_prefill(step)
        now = time.monotonic()
        for seq in self.steps.update_from_output(step):  # aborted ones are no longer in the model's batch
            req: SimRequest = seq.owner
            self.prefix_cache.insert(self.prefix_cache.chain(req.input_ids))
            self._append_token(req)
            if req.first_token_at is None:
                req.first_token_at = now
            self._after_token(req, last=seq.state in ("done", "held"))

    def _log_prefill(self, step: Step) -> None:
        """SGLang's `Prefill batch` line, logged as SGLang logs it (processing the batch's result), in its format, so
        the readers of real server logs (perfmodel/prefill_log.py, calibrate/logparse.py) read ours too."""
        assert step.forward is not None
        b = self.batch
        new_tokens = sum(take for _, take in step.forward.prefill)
        cached = sum(seq.prefilled for seq, _ in step.forward.prefill if seq.prefilled == seq.owner.cached_tokens)
        log.info("Prefill batch, #new-seq: %d, #new-token: %d, #cached-token: %d, token usage: %.2f, #running-req: %d, "
                 "#queue-req: %d, ", len(step.forward.prefill), new_tokens, cached,
                 b.kv_used / max(1, self.limits.kv_capacity_tokens), len(b.running), len(b.waiting))

    async def _run_decode_step(self, step: Step) -> None:
        assert step.forward is not None  # retracted requests left the running batch and keep their tokens
        started = time.monotonic()
        await self._sleep_modelled(step.forward.duration_s)
        ended = {id(seq) for seq in self.steps.update_from_output(step)}
        produced = 0
        for seq in step.forward.running:
            req: SimRequest = seq.owner
            if req.finished:  # aborted while the step ran
                continue
            self._append_token(req)
            produced += 1
            self._after_token(req, last=id(seq) in ended)
        self.decode_steps += 1
        self._recent_steps.append((started, time.monotonic(), produced))

    def _append_token(self, req: SimRequest) -> None:
        token = output_token(req.seed, len(req.output_ids), self.vocab_size)
        req.output_ids.append(corrupt_token(token, self.vocab_size) if req.corrupt else token)
        req.updated.set()

    def _after_token(self, req: SimRequest, last: bool) -> None:
        """Finish a request at its last token (the model says when: max_new_tokens) or at a stop token."""
        if last:
            self._finish(req, {"type": "length", "length": req.max_new_tokens})
        elif (not req.ignore_eos and req.output_ids[-1] == self.eos_token_id
              and len(req.output_ids) > req.min_new_tokens):
            self._finish(req, {"type": "stop", "matched": self.eos_token_id})

    def _finish(self, req: SimRequest, reason: dict) -> None:
        if req.finished:
            return
        req.finish_reason = reason
        req.finished_at = time.monotonic()
        self._live.discard(req)
        if req.seq is not None and self.failure is None:
            self.steps.finish(req.seq)  # frees its KV, unless a PD prefill holds it for the transfer
        req.preallocated.set()  # a PD decode waiting for pre-allocation stops waiting
        req.updated.set()
        req.finished_event.set()
        if self.on_finish is not None:
            self.on_finish(req)
        self._wake.set()
