"""PD pairing core: send one request to a prefill and a decode server at once, the SGLang PD way.

For each request: pick a prefill and a decode (or one aggregated worker) with the routing policy,
give both legs the same body with the same explicit `rid` and a fresh `bootstrap_room`, plus the
chosen prefill's `bootstrap_host`/`bootstrap_port`; return the decode's answer (or relay its SSE
stream). The dispatcher owns what SGLang 0.5.17 does not: a timeout on every leg sized to the time
left, `POST /abort_request` on both legs when one fails, bounded retries on another pair, and
"suspect" marks that keep a failing worker out for a while. No Ray here: the Serve deployment
(`deployments/router.py`, through `orchestrator.router.core.RouterCore`) wraps this class; tests drive it directly on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Iterable

import aiohttp
import orjson

from orchestrator.records import WorkerEndpoint
from orchestrator.router.engine_client import EngineClient, EngineConnectionError
from orchestrator.router.failures import LegFailure, RetryState, final_error, http_failure, raise_if_stream_aborted
from orchestrator.router.ingress_metrics import MetricsSink
from orchestrator.router.json_response import json_bytes
from orchestrator.router.pairs import Answer, Pair, Progress, batch_size, fill_from_payload, request_shape, with_pairing
from orchestrator.router.policies import NoWorkerError, RequestShape, RoutingPolicy, WorkerState, eligible, make_policy
from orchestrator.router.relay import StreamRelay, answer_from_stream

log = logging.getLogger(__name__)

# Used when neither router.request_timeout_s nor a run deadline bounds a request (HTTP ingress).
DEFAULT_REQUEST_TIMEOUT_S = 600.0
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass
class DispatchSettings:
    """Knobs of the dispatcher; `from_router_config` maps the run config's `router` section."""

    policy: str = "prefix_aware"
    request_timeout_s: float | None = None  # per leg; None = time left before the deadline
    max_attempts: int = 2
    suspect_s: float = 10.0  # how long a failed worker is avoided
    backoff_s: float = 0.05  # before retry n: backoff_s * 2**(n-1)
    abort_timeout_s: float = 2.0
    prefill_grace_s: float = 5.0  # how long a prefill leg may lag behind its finished decode
    health_timeout_s: float = 5.0
    unhealthy_after_failures: int = 3  # consecutive failed /health probes
    max_connections: int = 2048  # pooled; hundreds of requests in flight, two legs each

    @classmethod
    def from_router_config(cls, router: Any) -> "DispatchSettings":
        return cls(
            policy=router.policy, request_timeout_s=router.request_timeout_s, max_attempts=router.max_attempts
        )


class PDDispatcher:
    """Pairs and sends requests to the current worker set; one instance per router replica."""

    def __init__(self, settings: DispatchSettings | None = None, mode: str = "pd", metrics: MetricsSink | None = None):
        if mode not in ("pd", "aggregated"):
            raise ValueError(f"layout.mode={mode!r}: dispatcher supports 'pd' or 'aggregated'")
        self.settings = settings or DispatchSettings()
        self.mode = mode
        self.metrics = metrics
        self.workers: dict[str, WorkerState] = {}
        self._policies: dict[str, RoutingPolicy] = {}
        self._rooms_in_flight: set[int] = set()
        self._rng = random.Random()
        self._session: aiohttp.ClientSession | None = None
        self._engine_client: EngineClient | None = None
        self._background: set[asyncio.Task] = set()
        self.aborts_sent = 0  # for tests and the benchmark: aborts actually delivered

    # ---- worker set -------------------------------------------------------------------------------

    def set_workers(self, endpoints: Iterable[WorkerEndpoint]) -> None:
        """Follow the registry: keep state of known workers, add new ones (healthy), drop gone ones."""
        fresh: dict[str, WorkerState] = {}
        for ep in endpoints:
            old = self.workers.get(ep.name)
            if old is not None and old.endpoint == ep:
                fresh[ep.name] = old
            else:
                fresh[ep.name] = WorkerState(ep)
        self.workers = fresh

    def _policy(self, role: str) -> RoutingPolicy:
        if role not in self._policies:
            self._policies[role] = make_policy(self.settings.policy, role)
        return self._policies[role]

    def pick_pair(self, request: RequestShape | None = None) -> Pair:
        """A pair for the next attempt; raises NoWorkerError when a role has no usable worker."""
        now = time.monotonic()
        ws = list(self.workers.values())
        request = request or RequestShape()
        total = request.prompt_tokens + request.max_new_tokens
        if self.mode == "aggregated":
            worker = self._policy("aggregated").pick(eligible(ws, "aggregated", now), request)
            return Pair(decode=worker, decode_tokens=total)
        prefill_policy = self._policy("prefill")
        prefill = prefill_policy.pick(eligible(ws, "prefill", now), request)
        new_tokens = getattr(prefill_policy, "new_tokens", None)  # a prefix-aware policy knows what is cached
        prefill_tokens = new_tokens(prefill, request) if new_tokens is not None else request.prompt_tokens
        decode = self._policy("decode").pick(eligible(ws, "decode", now), request)
        return Pair(decode=decode, prefill=prefill, prefill_tokens=prefill_tokens, decode_tokens=total)

    def set_progress(self, progress: Progress | None, state: str | None) -> None:
        if progress is None or progress.state == state:
            return
        if self.metrics is not None:
            self.metrics.state_change(progress.state, state)
        progress.state = state

    def mark_suspect(self, w: WorkerState) -> None:
        w.failures += 1
        w.suspect_until = time.monotonic() + self.settings.suspect_s

    def leg_start(self, w: WorkerState, tokens: int = 0) -> None:
        w.outstanding += 1
        w.outstanding_tokens += tokens
        if self.metrics is not None:
            self.metrics.worker_outstanding(w.endpoint.role, w.name, w.outstanding)

    def leg_done(self, w: WorkerState, tokens: int = 0) -> None:
        w.outstanding -= 1
        w.outstanding_tokens -= tokens
        if self.metrics is not None:
            self.metrics.worker_outstanding(w.endpoint.role, w.name, w.outstanding)

    # ---- HTTP plumbing ----------------------------------------------------------------------------

    @property
    def session(self) -> aiohttp.ClientSession:
        # Created lazily: an aiohttp session belongs to the event loop it was made in.
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.settings.max_connections, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None), raise_for_status=False
            )
        return self._session

    @property
    def engine_client(self) -> EngineClient:
        # The two legs of every request: a lean keep-alive client (aiohttp costs ~0.07-0.09 ms more per leg).
        if self._engine_client is None:
            self._engine_client = EngineClient()
        return self._engine_client

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(list(self._background), timeout=self.settings.abort_timeout_s + 1)
        if self._engine_client is not None:
            await self._engine_client.close()
            self._engine_client = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def check_health(self) -> dict[str, bool]:
        """GET /health on every worker concurrently; updates and returns each worker's health."""

        async def one(w: WorkerState) -> tuple[str, bool]:
            try:
                async with self.session.get(
                    w.endpoint.url + "/health", timeout=aiohttp.ClientTimeout(total=self.settings.health_timeout_s)
                ) as r:
                    return w.name, r.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return w.name, False

        results = dict(await asyncio.gather(*(one(w) for w in list(self.workers.values()))))
        for name, ok in results.items():
            w = self.workers.get(name)
            if w is None:
                continue
            # One slow probe under load is not death: only consecutive failures take a worker out.
            w.health_failures = 0 if ok else w.health_failures + 1
            w.healthy = w.health_failures < self.settings.unhealthy_after_failures
        return results

    def abort_in_background(self, w: WorkerState, rid: str) -> None:
        """POST /abort_request for `rid` without making the caller wait (the worker may be hung)."""

        async def abort() -> None:
            try:
                async with self.session.post(
                    w.endpoint.url + "/abort_request", json={"rid": rid},
                    timeout=aiohttp.ClientTimeout(total=self.settings.abort_timeout_s),
                ) as r:
                    await r.read()
                    if r.status == 200:
                        self.aborts_sent += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                log.info("abort of %s on %s not delivered: %r", rid, w.name, exc)

        task = asyncio.get_running_loop().create_task(abort())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _new_rid(self) -> str:
        # 32 hex digits like uuid4().hex (fixed width: batched items append a suffix), at a third of its cost
        return f"{self._rng.getrandbits(128):032x}"

    def _new_room(self) -> int:
        # Random 63-bit, never 0 (0 means "no metadata yet" to the decode); unique while in flight.
        # With prefill dp>1 SGLang maps room % dp to a DP rank: random rooms spread evenly.
        while True:
            room = self._rng.getrandbits(63)
            if room and room not in self._rooms_in_flight:
                return room

    def _leg_timeout_s(self, deadline_at: float | None) -> float:
        """Seconds each leg may take: the configured timeout, capped by the time left to the deadline."""
        limits = []
        if self.settings.request_timeout_s is not None:
            limits.append(self.settings.request_timeout_s)
        if deadline_at is not None:
            limits.append(deadline_at - time.time())
        return min(limits) if limits else DEFAULT_REQUEST_TIMEOUT_S

    # ---- one attempt --------------------------------------------------------------------------------

    async def _prefill_leg(self, w: WorkerState, body: bytes, stream: bool, tokens: int, timeout_s: float) -> float:
        """Post to the prefill and wait for its answer (sent after the KV transfer); return monotonic time."""
        self.leg_start(w, tokens)
        try:
            async with asyncio.timeout(timeout_s):
                r = await self.engine_client.post(w.endpoint.url, "/generate", body)
            if r.status != 200:
                raise http_failure("prefill", w, r.status, r.body)
            if stream:
                raise_if_stream_aborted("prefill", w, r.body)
            return time.monotonic()
        except TimeoutError:
            raise LegFailure("timeout", "prefill", w.name, f"no answer within {timeout_s:.1f}s", True, 504) from None
        except EngineConnectionError as exc:
            raise LegFailure("connect", "prefill", w.name, str(exc), True, 502) from None
        finally:
            self.leg_done(w, tokens)

    async def _decode_leg(self, w: WorkerState, body: bytes, stream: bool, tokens: int, timeout_s: float,
                          t0: float, answer: Answer) -> None:
        """Post to the decode and read its whole answer (JSON, or an SSE stream: TTFT at its first bytes)."""
        self.leg_start(w, tokens)
        on_first_body = (lambda: self.set_progress(answer.progress, "decoding")) if stream else None
        try:
            async with asyncio.timeout(timeout_s):
                r = await self.engine_client.post(w.endpoint.url, "/generate", body, on_first_body)
            if r.status != 200:
                raise http_failure("decode", w, r.status, r.body)
            if stream:
                answer_from_stream(w, r.body, answer)
                answer.ttft_s = r.first_body_at - t0 if r.first_body_at is not None else None
            else:
                answer.payload = orjson.loads(r.body)
                fill_from_payload(answer, answer.payload)
            answer.status = r.status
            answer.e2e_s = time.monotonic() - t0
        except TimeoutError:
            raise LegFailure("timeout", "decode", w.name, f"no answer within {timeout_s:.1f}s", True, 504) from None
        except EngineConnectionError as exc:
            raise LegFailure("connect", "decode", w.name, str(exc), True, 502) from None
        except orjson.JSONDecodeError as exc:
            raise LegFailure("bad_json", "decode", w.name, f"answer is not JSON: {exc}", True, 502) from None
        finally:
            self.leg_done(w, tokens)

    def _start_legs(self, body: dict, pair: Pair, rid: str, timeout_s: float) -> tuple[bytes, asyncio.Task | None]:
        """One attempt's body (explicit rid, fresh rooms) and its prefill leg, started; the caller runs the
        decode leg. The rooms stay reserved until the prefill leg (the KV sender) has ended."""
        rooms = [self._new_room() for _ in range(batch_size(body) or 1)] if pair.prefill is not None else []
        sent = json_bytes(with_pairing(body, pair, rid, rooms))  # once: the same bytes go to both legs
        if pair.prefill is None:
            return sent, None
        self._rooms_in_flight.update(rooms)
        prefill_task = asyncio.ensure_future(
            self._prefill_leg(pair.prefill, sent, bool(body.get("stream")), pair.prefill_tokens, timeout_s))
        prefill_task.add_done_callback(lambda _t: self._rooms_in_flight.difference_update(rooms))
        return sent, prefill_task

    async def _attempt_failed(self, exc: BaseException, pair: Pair, rid: str, prefill_task: asyncio.Task | None,
                              progress: Progress | None) -> None:
        """An attempt failed (or was cancelled) before its answer: end the prefill leg, abort both legs
        (same rid; not the decode a batch stop already aborted), keep the workers to blame out for a while."""
        if prefill_task is not None:
            prefill_task.cancel()
            await asyncio.gather(prefill_task, return_exceptions=True)
        self.set_progress(progress, "prefill")  # a retry starts over
        stopping = progress is not None and progress.stopping
        for w in (pair.prefill, None if stopping else pair.decode):
            if w is not None:
                self.abort_in_background(w, rid)
        if isinstance(exc, LegFailure):
            if exc.kind == "timeout":  # a stalled exchange implicates every leg still waiting
                for w in (pair.prefill, pair.decode):
                    if w is not None:
                        self.mark_suspect(w)
            elif exc.retryable:
                self.mark_suspect(self.workers.get(exc.worker) or pair.decode)

    async def _attempt(self, body: dict, pair: Pair, timeout_s: float, answer: Answer) -> None:
        """Both legs of one attempt, concurrently; on any failure abort both and raise LegFailure."""
        rid = answer.rid
        t0 = time.monotonic()
        # TTFT and e2e count from the request's first send (retries included); kv_wait is this attempt's.
        # The decode leg runs in this task, the prefill leg beside it; a prefill that fails while the
        # decode waits cancels this task (its decode leg would wait for KV that never comes).
        me, cut = asyncio.current_task(), [False, False]  # [decoding, cut by the prefill]
        assert me is not None, "an attempt runs in its request's task"
        if answer.progress is not None:
            answer.progress.attempt = (rid, pair)
        sent, prefill_task = self._start_legs(body, pair, rid, timeout_s)
        if prefill_task is not None:

            def on_prefill_done(t: asyncio.Future) -> None:
                if cut[0] and not t.cancelled() and t.exception() is not None:
                    cut[1] = True
                    me.cancel()

            prefill_task.add_done_callback(on_prefill_done)
        try:
            cut[0] = True
            try:
                await self._decode_leg(pair.decode, sent, bool(body.get("stream")), pair.decode_tokens, timeout_s,
                                       answer.origin, answer)
            except asyncio.CancelledError:
                if not cut[1] or me.uncancel() > 0:
                    raise  # cancelled from outside (too)
                failure = prefill_task.exception() if prefill_task is not None else None
                assert failure is not None, "only a failed prefill leg cuts the decode"
                raise failure from None
            finally:
                cut[0] = False
            if prefill_task is not None:
                # Once the decode has answered, the prefill leg only adds kv_wait: do not let a
                # prefill that never answers (0.5.17 NIXL has no timeout there) turn success into failure.
                if not prefill_task.done():
                    await asyncio.wait((prefill_task,), timeout=self.settings.prefill_grace_s)
                if not prefill_task.done():  # the prefill outlived its decode: free it
                    prefill_task.cancel()
                    if pair.prefill is not None:  # it is: the pair has a prefill leg
                        self.abort_in_background(pair.prefill, rid)
                elif (failure := prefill_task.exception()) is not None:
                    raise failure
                else:
                    answer.kv_wait_s = prefill_task.result() - t0
        except BaseException as exc:
            await self._attempt_failed(exc, pair, rid, prefill_task, answer.progress)
            raise
        finally:
            if answer.progress is not None:
                answer.progress.attempt = None

    # ---- public: one request ------------------------------------------------------------------------

    async def generate(self, body: dict, deadline_at: float | None = None, progress: Progress | None = None) -> Answer:
        """Send one /generate body (stream or not) with retries; the decode's answer, or DispatchError."""
        sent_at, origin = time.time(), time.monotonic()
        state = RetryState()
        async with contextlib.aclosing(self._attempts(deadline_at, state, request_shape(body))) as attempts:
            async for attempt, pair, _ in attempts:
                if progress is not None and progress.stopping:
                    break
                answer = Answer(status=0, payload=None, pair=pair, rid=self._new_rid(), attempts=attempt,
                                sent_at=sent_at, origin=origin, progress=progress)
                try:
                    await self._attempt(body, pair, self._leg_timeout_s(deadline_at), answer)
                    return answer
                except LegFailure as exc:
                    state.last = exc
                    log.info("attempt %d of %s failed: %s", attempt, answer.rid, exc)
                    if not exc.retryable or (progress is not None and progress.stopping):
                        break
        raise final_error(state.last, state.attempts, deadline_at)

    async def open_stream(self, body: dict, deadline_at: float | None = None) -> StreamRelay:
        """Start a streamed request; returns once the decode answered its headers (retrying before that)."""
        state = RetryState()
        async with contextlib.aclosing(self._attempts(deadline_at, state, request_shape(body))) as attempts:
            async for attempt, pair, timeout_s in attempts:
                try:
                    return await self._open_stream_once(body, pair, timeout_s, attempt)
                except LegFailure as exc:
                    state.last = exc
                    if not exc.retryable:
                        break
        raise final_error(state.last, state.attempts, deadline_at)

    async def _attempts(
        self, deadline_at: float | None, state: RetryState, request: RequestShape | None = None
    ) -> AsyncGenerator[tuple[int, Pair, float], None]:
        """(attempt, pair, leg timeout) for each try: bounded count, backoff, time left before the deadline.

        An attempt with no worker to pick is skipped (its error kept in `state`); the caller records leg
        failures in `state.last` and stops early on a non-retryable one.
        """
        for attempt in range(1, self.settings.max_attempts + 1):
            timeout_s = self._leg_timeout_s(deadline_at)
            if timeout_s <= 0:
                return
            if attempt > 1:
                await asyncio.sleep(min(self.settings.backoff_s * 2 ** (attempt - 2), timeout_s))
            try:
                pair = self.pick_pair(request)
            except NoWorkerError as exc:
                state.last = exc
                continue
            state.attempts = attempt
            yield attempt, pair, timeout_s

    async def _open_stream_once(self, body: dict, pair: Pair, timeout_s: float, attempt: int) -> StreamRelay:
        rid = self._new_rid()
        deadline = time.monotonic() + timeout_s
        sent, prefill_task = self._start_legs(body, pair, rid, timeout_s)
        w = pair.decode
        self.leg_start(w, pair.decode_tokens)
        resp = None
        try:
            try:
                async with asyncio.timeout(timeout_s):
                    resp = await self.session.post(w.endpoint.url + "/generate", data=sent, headers=JSON_HEADERS)
            except TimeoutError:
                raise LegFailure("timeout", "decode", w.name, f"no answer within {timeout_s:.1f}s", True, 504) from None
            except aiohttp.ClientError as exc:
                raise LegFailure("connect", "decode", w.name, repr(exc), True, 502) from None
            if resp.status != 200:
                raise http_failure("decode", w, resp.status, await resp.read())
        except BaseException as exc:
            self.leg_done(w, pair.decode_tokens)
            if resp is not None:
                resp.release()
            await self._attempt_failed(exc, pair, rid, prefill_task, None)
            raise
        return StreamRelay(self, resp, pair, rid, prefill_task, deadline, attempt)
