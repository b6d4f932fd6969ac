"""Continuous-batching scheduler of the simulated engine, timed by the cost model and free of HTTP.

submit(SimRequest) -> waiting -> prefill batches (chunked, token budget) -> running -> decode steps -> finished

One asyncio task runs the loop: like SGLang without mixed chunks it runs either one prefill batch or one
decode step at a time, prefill first, and sleeps for the cost model's time of that batch x time_scale x
the fault injector's slow factor. Requests are admitted while the running count stays under
max_running_requests and their KV (prompt + max_new_tokens) fits in the KV pool. Callers wait on
`SimRequest.updated` and read `output_ids` / `finish_reason`.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from orchestrator.engines.sim.prefix_cache import PrefixCache

log = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1
GEN_THROUGHPUT_WINDOW_STEPS = 40  # SGLang's default --decode-log-interval
MAX_CATCH_UP_S = 2.0  # how far behind the model's timeline a busy host may fall and still catch up (wall s)


class StepCostModel(Protocol):
    """The part of the cost model the scheduler needs (orchestrator.perfmodel.costmodel.EngineCostModel)."""

    def prefill_time_s(self, new_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None) -> float: ...

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float: ...


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
    first_token: int | None = None  # PD decode: sampled by the prefill, arrived with the KV
    kv_prereserved: bool = False  # PD decode: KV was pre-allocated before the transfer
    hold_kv: bool = False  # PD prefill: KV stays allocated after finishing, until release() (transfer)
    corrupt: bool = False
    created_at: float = field(default_factory=time.monotonic)
    prefilled_tokens: int = 0
    cached_tokens: int = 0  # leading prompt tokens found in the server's prefix cache (not computed)
    output_ids: list[int] = field(default_factory=list)
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: dict | None = None
    kv_need: int = 0  # KV slots it takes when admitted
    kv_tokens: int = 0  # KV slots it holds now
    updated: asyncio.Event = field(default_factory=asyncio.Event)  # new tokens or finished (streaming)
    finished_event: asyncio.Event = field(default_factory=asyncio.Event)  # finished only (one wake-up)

    def __post_init__(self) -> None:
        self.seed = prompt_seed(self.input_ids)

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def aborted(self) -> bool:
        return self.finish_reason is not None and self.finish_reason.get("type") == "abort"


@dataclass(frozen=True)
class SchedulerLimits:
    """Capacity and pacing of one simulated server."""

    max_running_requests: int
    kv_capacity_tokens: int
    chunked_prefill_tokens: int
    time_scale: float = 1.0


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
    ):
        if limits.kv_capacity_tokens < 1:
            raise ValueError(
                f"KV capacity is {limits.kv_capacity_tokens} tokens: the model's weights leave no GPU memory "
                "for KV cache at this TP size/quantization; use more GPUs per server or a smaller checkpoint"
            )
        self.cost = cost
        self.limits = limits
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.slow_factor = slow_factor
        self.on_finish = on_finish
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.chunked: SimRequest | None = None  # the one request whose prefill spans several batches
        self.running: list[SimRequest] = []  # prefilled, generating
        self.prefilling: list[SimRequest] = []  # in the prefill batch that is running now
        self.kv_used_tokens = 0
        self.prefix_cache = PrefixCache(limits.kv_capacity_tokens)
        self.decode_steps = 0
        self.prefill_batches = 0
        self._recent_steps: collections.deque[tuple[float, float, int]] = collections.deque(
            maxlen=GEN_THROUGHPUT_WINDOW_STEPS
        )
        self._wake = asyncio.Event()
        self._kv_freed = asyncio.Condition()
        self._task: asyncio.Task | None = None
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
    def max_request_tokens(self) -> int:
        return self.limits.kv_capacity_tokens

    def submit(self, req: SimRequest) -> None:
        """Queue a request. The caller has checked prompt_len < capacity; max_new_tokens is clamped to fit."""
        room = self.limits.kv_capacity_tokens - req.prompt_len
        req.max_new_tokens = max(1, min(req.max_new_tokens, room))
        if not req.kv_prereserved:
            req.kv_need = req.prompt_len + req.max_new_tokens
        self.waiting.append(req)
        self._wake.set()

    def kv_reserve_tokens(self, prompt_len: int, max_new_tokens: int) -> int:
        """KV a request will hold: its prompt plus every token it may generate (no retraction here)."""
        return min(prompt_len + max_new_tokens, self.limits.kv_capacity_tokens)

    async def reserve_kv(self, tokens: int) -> None:
        """PD decode pre-allocation: wait until `tokens` KV slots are free, then take them."""
        async with self._kv_freed:
            await self._kv_freed.wait_for(lambda: self._kv_free() >= tokens)
            self.kv_used_tokens += tokens

    async def release_kv(self, tokens: int) -> None:
        async with self._kv_freed:
            self.kv_used_tokens = max(0, self.kv_used_tokens - tokens)
            self._kv_freed.notify_all()
        self._wake.set()

    async def release(self, req: SimRequest) -> None:
        """Free a finished hold_kv request's KV (PD prefill, after its transfer ended)."""
        tokens, req.kv_tokens = req.kv_tokens, 0
        if tokens:
            await self.release_kv(tokens)

    def abort(self, rid_prefix: str, abort_all: bool = False, message: str = "Aborted by AbortReq.") -> int:
        """Abort every unfinished request whose rid starts with rid_prefix (SGLang's prefix match)."""
        matched = [
            r
            for r in {*self.waiting, *self.prefilling, *([self.chunked] if self.chunked else []), *self.running}
            if not r.finished and (abort_all or (bool(rid_prefix) and r.rid.startswith(rid_prefix)))
        ]
        for r in matched:
            self._finish(r, {"type": "abort", "message": message})
        return len(matched)

    def abort_request(self, req: SimRequest, message: str = "Aborted by AbortReq.") -> None:
        """Abort exactly this request (the server resolved the rid prefix itself)."""
        self._finish(req, {"type": "abort", "message": message})

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running_reqs=len(self.running) + len({*self.prefilling, *([self.chunked] if self.chunked else [])}),
            num_queue_reqs=len(self.waiting),
            kv_used_tokens=self.kv_used_tokens,
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
        return not self.waiting and self.chunked is None and not self.running and not self.prefilling

    # ----- the loop --------------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            try:
                batch = self._form_prefill_batch()
                if batch:
                    await self._run_prefill(batch)
                elif self.running:
                    await self._run_decode_step()
                else:
                    self._timeline_at = None  # idle: the next step starts when work arrives
                    await self._wake.wait()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not leave clients waiting forever
                log.exception("scheduler step failed; aborting all requests")
                self.abort("", abort_all=True, message="simulated scheduler error; see server log")

    def _kv_free(self) -> int:
        return self.limits.kv_capacity_tokens - self.kv_used_tokens

    def _form_prefill_batch(self) -> list[tuple[SimRequest, int]]:
        """(request, new tokens this batch) within the chunked-prefill budget; admits waiting requests."""
        budget = self.limits.chunked_prefill_tokens
        batch: list[tuple[SimRequest, int]] = []
        if self.chunked is not None:
            req, self.chunked = self.chunked, None
            take = min(req.prompt_len - req.prefilled_tokens, budget)
            batch.append((req, take))
            budget -= take
            if req.prefilled_tokens + take < req.prompt_len:
                self.chunked = req
                return batch
        while self.waiting and budget > 0:
            req = self.waiting[0]
            if len(self.running) + len(batch) >= self.limits.max_running_requests:
                break
            if req.first_token is not None:  # PD decode: KV arrived by transfer, nothing to compute
                self.waiting.popleft()
                self._start_decoding(req)
                continue
            if not req.kv_prereserved:
                if req.kv_need > self._kv_free():
                    break  # FIFO like SGLang's default policy: the head waits for KV, nobody overtakes it
                self.kv_used_tokens += req.kv_need
                req.kv_tokens = req.kv_need
            self.waiting.popleft()
            if req.prefilled_tokens == 0:  # SGLang computes at least the last prompt token
                req.cached_tokens = req.prefilled_tokens = min(self.prefix_cache.match(req.input_ids),
                                                               req.prompt_len - 1)
            take = min(req.prompt_len - req.prefilled_tokens, budget)
            batch.append((req, take))
            budget -= take
            if req.prefilled_tokens + take < req.prompt_len:
                self.chunked = req
                break
        return batch

    def _start_decoding(self, req: SimRequest) -> None:
        now = time.monotonic()
        req.output_ids.append(req.first_token)  # type: ignore[arg-type]
        req.first_token_at = now
        req.updated.set()
        if not self._check_finished(req):
            self.running.append(req)

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

    async def _run_prefill(self, batch: list[tuple[SimRequest, int]]) -> None:
        new = [take for _, take in batch]
        cached = [req.prefilled_tokens for req, _ in batch]
        self.prefilling = [req for req, _ in batch]
        try:
            await self._sleep_modelled(self.cost.prefill_time_s(new, cached))
        finally:
            self.prefilling = []
        self.prefill_batches += 1
        now = time.monotonic()
        for req, take in batch:
            if req.finished:  # aborted while the batch ran
                continue
            req.prefilled_tokens += take
            if req.prefilled_tokens < req.prompt_len:
                continue
            self.prefix_cache.insert(req.input_ids)
            token = output_token(req.seed, 0, self.vocab_size)
            req.output_ids.append(corrupt_token(token, self.vocab_size) if req.corrupt else token)
            req.first_token_at = now
            req.updated.set()
            if not self._check_finished(req):
                self.running.append(req)

    async def _run_decode_step(self) -> None:
        batch = list(self.running)
        context = sum(r.prompt_len + len(r.output_ids) for r in batch)
        started = time.monotonic()
        await self._sleep_modelled(self.cost.decode_step_s(len(batch), context))
        produced = 0
        for req in batch:
            if req.finished:
                continue
            token = output_token(req.seed, len(req.output_ids), self.vocab_size)
            req.output_ids.append(corrupt_token(token, self.vocab_size) if req.corrupt else token)
            produced += 1
            req.updated.set()
            self._check_finished(req)
        self.decode_steps += 1
        self._recent_steps.append((started, time.monotonic(), produced))

    def _check_finished(self, req: SimRequest) -> bool:
        last = req.output_ids[-1] if req.output_ids else None
        if not req.ignore_eos and last == self.eos_token_id:
            self._finish(req, {"type": "stop", "matched": self.eos_token_id})
        elif len(req.output_ids) >= req.max_new_tokens:
            self._finish(req, {"type": "length", "length": req.max_new_tokens})
        return req.finished

    def _finish(self, req: SimRequest, reason: dict) -> None:
        if req.finished:
            return
        req.finish_reason = reason
        req.finished_at = time.monotonic()
        if req in self.running:
            self.running.remove(req)
        if req is self.chunked:
            self.chunked = None
        try:
            self.waiting.remove(req)
        except ValueError:
            pass
        if not req.hold_kv and req.kv_tokens:
            self.kv_used_tokens = max(0, self.kv_used_tokens - req.kv_tokens)
            req.kv_tokens = 0
            asyncio.get_running_loop().create_task(self._notify_kv_freed())
        req.updated.set()
        req.finished_event.set()
        if self.on_finish is not None:
            self.on_finish(req)
        self._wake.set()

    async def _notify_kv_freed(self) -> None:
        async with self._kv_freed:
            self._kv_freed.notify_all()
