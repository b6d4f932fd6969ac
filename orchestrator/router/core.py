"""PD router deployment: `ingress (FastAPI) -> PDRouter -> {prefill workers, decode workers}` over HTTP.

`PDRouter` is the Serve deployment; it follows the worker registry (endpoints appear and disappear as
worker replicas start and stop) and hands every request to a `PDDispatcher`, which talks to the engine
servers directly over HTTP (a Serve hop per token would cost ~1 ms). Two ways in:
- the benchmark's handle API: `wait_ready(...)`, then `generate_batch_chunks(...)` (stream=True handle), a
  list of the `RequestResult`s finished within 50 ms per item (`generate_batch`: one result per item);
- HTTP: SGLang's `/generate`, OpenAI `/v1/completions` and `/v1/chat/completions` (stream or not),
  `/health`, `/v1/models`, `/server_info`, `/model_info`, so `sglang.bench_serving` and the openai
  client work unmodified. Prompts are sent to engines as token ids from the faithful tokenizer.

`RouterCore` holds the state and logic without Serve, so the HTTP app (`build_http_app`) also runs under
plain uvicorn in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Awaitable

from orchestrator.api.generate import GenerateBody
from orchestrator.config import RunConfig
from orchestrator.records import WorkerEndpoint
from orchestrator.router.dispatch.dispatcher import PDDispatcher
from orchestrator.router.dispatch.failures import DispatchError
from orchestrator.router.dispatch.settings import DispatchSettings
from orchestrator.router.ingress_metrics import IngressTracker, MetricsSink

if TYPE_CHECKING:
    from orchestrator.workload.tokenizer import FaithfulTokenizer

log = logging.getLogger(__name__)

HEALTH_CHECK_EVERY_S = 5.0


# ---- HTTP bodies ---------------------------------------------------------------------------------------


class HTTPError(Exception):
    """An error answered as OpenAI's `{"error": {"message", "type", "param", "code"}}` (json_response.error_object);
    `body` is an engine's own 4xx body, answered in the same shape with its message."""

    def __init__(self, status: int, message: str, body: Any = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body
        self.code = code


# ---- the router's state and logic, without Serve ------------------------------------------------------


class RouterCore:
    """Worker set (from the registry), dispatcher, tokenizer, limits: everything the entry points share."""

    def __init__(self, cfg: RunConfig, run_id: str = "run", metrics: MetricsSink | None = None):
        self.cfg = cfg
        self.run_id = run_id
        self.metrics = metrics
        self.model_name = cfg.model.name
        self.dispatcher = PDDispatcher(DispatchSettings.from_router_config(cfg.router), cfg.layout.mode, metrics)
        self.api_key = self._read_api_key(cfg.router.api_key_env)
        self._tokenizer: FaithfulTokenizer | None = None
        self._tokenizer_lock = asyncio.Lock()
        self.registry_version: int | None = None
        self.in_flight = 0  # inference requests the HTTP ingress holds now (router.max_in_flight_requests)
        self.rejected = 0
        self.stopping: str | None = None  # why the service stops: from then on new inference requests get a 503
        self.cut_off = asyncio.Event()  # set after the drain timed out: each request still held ends with a 503
        self._all_answered: asyncio.Event | None = None  # set when the last cut-off request has been answered
        self.departed: dict[str, Any] = {}  # WorkerStates the registry no longer routes to, legs maybe in flight
        self._last_health_check = 0.0

    @staticmethod
    def _read_api_key(env: str | None) -> str | None:
        if env is None:
            return None
        key = os.environ.get(env)
        if not key:
            raise ValueError(
                f"router.api_key_env={env!r} but ${env} is empty in the router's environment; export it "
                "where the cluster runs (or pass it through the job's runtime_env), or unset router.api_key_env"
            )
        return key

    @property
    def roles(self) -> tuple[str, ...]:
        return ("aggregated",) if self.cfg.layout.mode == "aggregated" else ("prefill", "decode")

    # -- workers --

    def follow(self, version: int, endpoints: list[WorkerEndpoint]) -> None:
        if version != self.registry_version:
            self.registry_version = version
            before = self.dispatcher.workers
            self.dispatcher.set_workers(endpoints)
            for name, state in before.items():  # a retired worker may still hold legs picked before it left
                if self.dispatcher.workers.get(name) is not state:
                    self.departed[name] = state
            if self.metrics is not None:
                for e in endpoints:  # series start at 0 so rate()/increase() count a worker's first tokens
                    self.metrics.add_worker(e.role, e.name)
            log.info("router: registry v%d, workers %s", version, sorted(e.name for e in endpoints))

    def legs_in_flight(self) -> dict[str, int]:
        """Legs this router has open per worker, routed or departed (a drain waits for a departed one's 0)."""
        self.departed = {name: w for name, w in self.departed.items()
                         if w.outstanding > 0 and self.dispatcher.workers.get(name) is not w}
        out = {name: w.outstanding for name, w in self.departed.items()}
        for name, w in self.dispatcher.workers.items():
            out[name] = out.get(name, 0) + w.outstanding
        return out

    async def maybe_check_health(self) -> None:
        if time.monotonic() - self._last_health_check >= HEALTH_CHECK_EVERY_S:
            self._last_health_check = time.monotonic()
            await self.dispatcher.check_health()

    def ready_counts(self) -> dict[str, int]:
        counts = {role: 0 for role in self.roles}
        for w in self.dispatcher.workers.values():
            if w.healthy and w.endpoint.role in counts:
                counts[w.endpoint.role] += 1
        return counts

    def take_slot(self) -> None:
        """One more inference request in flight, or HTTPError 503 (counted) while the service stops or past
        router.max_in_flight_requests."""
        if self.stopping is not None:
            self.rejected += 1
            if self.metrics is not None:
                self.metrics.rejected("stopping")
            raise HTTPError(503, f"{self.stopping}: the gateway takes no new requests while those in flight finish; "
                                 "send this one to another gateway or retry once the service is back",
                            code="shutting_down")
        limit = self.cfg.router.max_in_flight_requests
        if limit is not None and self.in_flight >= limit:
            self.rejected += 1
            if self.metrics is not None:
                self.metrics.rejected("queue_full")
            raise HTTPError(503, f"gateway busy: {self.in_flight} requests in flight, the limit "
                                 f"router.max_in_flight_requests={limit}; retry later or raise the limit",
                            code="gateway_busy")
        self.in_flight += 1

    def free_slot(self) -> None:
        self.in_flight -= 1
        if not self.in_flight and self._all_answered is not None:
            self._all_answered.set()

    def stop_admitting(self, reason: str) -> None:
        """The service stops: new inference requests are refused (503) and /health says so; those in flight go on."""
        self.stopping = reason

    async def cut_off_in_flight(self, wait_s: float = 10.0) -> int:
        """End every inference request still held with a 503 (a stream: an error event, then [DONE]), which aborts
        its legs on the engines; returns how many there were, once they are answered (at most `wait_s`)."""
        held = self.in_flight
        self.cut_off.set()
        if self.in_flight:
            self._all_answered = asyncio.Event()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._all_answered.wait(), wait_s)
        return held

    # -- prompts --

    async def tokenizer(self):
        async with self._tokenizer_lock:
            if self._tokenizer is None:
                from orchestrator.workload.tokenizer import load_tokenizer

                self._tokenizer = await asyncio.to_thread(load_tokenizer, self.cfg.model.path, self.cfg.model.preset)
        return self._tokenizer

    async def encode(self, text: str) -> list[int]:
        return (await self.tokenizer()).encode(text, add_special_tokens=True)

    async def decode_text(self, ids: list[int]) -> str:
        return (await self.tokenizer()).decode(ids)

    def check_prompt_len(self, n_tokens: int, where: str) -> None:
        limit = self.cfg.router.max_prompt_tokens
        if n_tokens > limit:
            raise HTTPError(
                400, f"{where}: prompt has {n_tokens} tokens, more than router.max_prompt_tokens={limit}; "
                "shorten the prompt or raise router.max_prompt_tokens", code="context_length_exceeded"
            )

    async def to_input_ids(self, body: GenerateBody) -> dict:
        """The engine body: text replaced by faithful token ids (SGLang 0.5.17's own tokenizer mangles DeepSeek)."""
        out = body.model_dump(exclude_unset=True, exclude_none=True)  # what the client sent, no defaults added
        if body.text is not None:
            out.pop("text")
            if isinstance(body.text, list):
                out["input_ids"] = [await self.encode(t) for t in body.text]
            else:
                out["input_ids"] = await self.encode(body.text)
        ids = out["input_ids"]
        batched = body.is_batch
        for i, item in enumerate(ids if batched else [ids]):
            self.check_prompt_len(len(item), f"input_ids[{i}]" if batched else "input_ids")
        out.pop("rid", None)  # the router owns rids: they must be unique and prefix-free
        return out

    # -- dispatch --

    async def _dispatched(self, track: IngressTracker, dispatch: Awaitable[Any]) -> Any:
        """The dispatcher's answer; a DispatchError becomes its HTTP error, and every failure is counted."""
        try:
            return await dispatch
        except DispatchError as exc:
            track.failed(str(exc))
            raise HTTPError(exc.status, str(exc), exc.body, exc.code) from None
        except BaseException:
            self._ended_unanswered(track)
            raise

    def _ended_unanswered(self, track: IngressTracker) -> None:
        """A request cancelled before its answer ended: by the gateway's cut-off (the client gets a 503 or an error
        event, an error for AIPerf), else because its client went away."""
        if self.cut_off.is_set():
            track.failed("cut_off: the gateway's drain timed out before the answer ended")
        else:
            track.client_left()

    async def generate(self, body: dict) -> dict:
        track = IngressTracker(self.metrics, body)
        answer = await self._dispatched(track, self.dispatcher.generate(body, progress=track.progress))
        track.answered(answer.payload, answer.pair, answer.ttft_s, answer.kv_wait_s)
        return answer.payload

    async def open_stream(self, body: dict):
        track = IngressTracker(self.metrics, body)
        relay = await self._dispatched(track, self.dispatcher.open_stream(body))

        def on_close(relay) -> None:
            if relay.client_left:
                self._ended_unanswered(track)
            elif relay.failure is not None:  # the client's stream ends with an `event: error` (relay.ending)
                track.failed(str(relay.failure))
            else:
                ttft_s = relay.first_byte_at - track.started if relay.first_byte_at is not None else None
                track.answered(relay.last_event, relay.pair, ttft_s=ttft_s, kv_wait_s=relay.kv_wait_s)

        relay.on_close = on_close
        return relay

    async def server_info(self) -> dict:
        """mini_lb's merged shape: decode internal_states first, then every server's info by role."""
        session = self.dispatcher.session
        merged: dict[str, Any] = {"router": "pd-orchestrator", "run_id": self.run_id, "internal_states": []}
        for w in sorted(self.dispatcher.workers.values(), key=lambda w: w.name):
            try:
                async with session.get(w.endpoint.url + "/server_info") as r:
                    info = await r.json(content_type=None)
            except Exception as exc:  # one unreachable worker must not hide the others
                info = {"error": repr(exc)}
            info["worker"] = w.name
            merged.setdefault(w.endpoint.role, []).append(info)
            if w.endpoint.role in ("decode", "aggregated"):
                merged["internal_states"].extend(info.get("internal_states") or [])
            if info.get("simulated"):
                merged["simulated"] = True
        if not merged["internal_states"]:
            merged["internal_states"] = [{"last_gen_throughput": 0.0, "avg_spec_accept_length": None}]
        return merged

    async def model_info(self) -> dict:
        for w in sorted(self.dispatcher.workers.values(), key=lambda w: w.name):
            try:
                async with self.dispatcher.session.get(w.endpoint.url + "/model_info") as r:
                    if r.status == 200:
                        return await r.json(content_type=None)
            except Exception:
                continue
        return {"model_path": self.cfg.model.path or self.model_name, "tokenizer_path": self.cfg.model.path,
                "is_generation": True}


# ---- HTTP app ------------------------------------------------------------------------------------------


# ---- the Serve deployment -------------------------------------------------------------------------------


