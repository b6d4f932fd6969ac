"""The simulated engine: one SimEngine per server process, timed by the cost model of its settings.

SimEngine owns the scheduler, metrics, fault injector and PD KV transfer side; it checks each item, starts its Run
(inflight.py) and drives it (a PD leg's handshake and transfer: pd_legs.py) to SGLang's answer. `server.py` puts
SGLang's HTTP API in front of it and `requests.py` turns /generate bodies into items.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from orchestrator.api.generate import SamplingParams
from orchestrator.engines.sim.faults import FaultInjector, RequestFate, crash, parse_fault_spec
from orchestrator.engines.sim.inflight import Run
from orchestrator.engines.sim.kv.decode import KvReceiver
from orchestrator.engines.sim.kv.prefill import PrefillKvServer
from orchestrator.engines.sim.kv.transfer import MIB, KvTransferError, resolve_transfer_mode
from orchestrator.engines.sim.metrics import MetricLabels, PdQueueSizes, SimMetrics
from orchestrator.engines.sim.pd_legs import drive_decode, drive_prefill
from orchestrator.engines.sim.requests import BadRequest, Item, TextCodec
from orchestrator.engines.sim.scheduler import Scheduler, SchedulerLimits
from orchestrator.engines.sim.sim_request import SimRequest
from orchestrator.engines.sim.settings import SimSettings, architecture_of, cost_model_of
from orchestrator.perfmodel.scheduling.limits import server_limits

log = logging.getLogger("orchestrator.engines.sim.server")

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's warm-up/health host: no peer, no transfer
MISSING_ROOM = "Invalid request: Disaggregated request received without bootstrap room id."


class SimEngine:
    """The simulated worker: owns the scheduler, metrics, faults and (in PD) the KV transfer side."""

    def __init__(self, settings: SimSettings):
        self.settings = settings
        self.arch = architecture_of(settings)
        self.cost = cost_model_of(settings, self.arch)
        capacity = self.cost.kv_capacity_tokens()
        if capacity < 1:
            raise ValueError(
                f"{self.arch.name} ({settings.quantization}) weights need "
                f"{self.cost.weights_bytes_per_gpu() / 2**30:.1f} GiB per GPU at tp={settings.spec.parallel.tp}, more than "
                f"{self.cost.mem_fraction_static:.2f} x the {self.cost.free_at_load_bytes() / 2**30:.1f} GiB of {settings.profile} "
                "free when the weights load: "
                "no room for KV cache; raise --tp-size or use a smaller weight format (--quantization)"
            )
        self.transfer_mode = resolve_transfer_mode(settings.kv_transfer) if settings.mode != "null" else "none"
        breakdown = self.cost.startup_breakdown_s("dummy")
        modelled_startup = sum(breakdown.values())
        self.startup_s = (
            settings.startup_s if settings.startup_s is not None else modelled_startup * settings.time_scale
        )
        scale = self.startup_s / modelled_startup if modelled_startup > 0 else 0.0
        self.startup_phases = {
            "load_weight": breakdown["weights"] * scale,
            "kv_cache_allocation": breakdown["kv_alloc"] * scale,
            "cuda_graph": breakdown["cuda_graphs"] * scale,
            "tokenizer_e2e": breakdown["init"] * scale,
            "scheduler_e2e": self.startup_s,
        }
        self.faults = FaultInjector(parse_fault_spec(settings.faults))
        self.scheduler = Scheduler(
            self.cost,
            SchedulerLimits.of(server_limits(self.cost, capacity), settings.time_scale),
            vocab_size=self.arch.vocab_size,
            eos_token_id=self.arch.eos_token_id,
            slow_factor=lambda: self.faults.step_factor,
            before_step=lambda: self.faults.on_step(),
        )
        self.metrics = SimMetrics(
            MetricLabels(settings.served_model_name, settings.engine_type),
            max_total_num_tokens=capacity,
            startup_phases_s=self.startup_phases,
        )
        self.queues = PdQueueSizes()
        self.runs: set[Run] = set()  # in flight; rids may repeat, so not keyed by rid
        self.codec: TextCodec | None = None
        self.ready = False
        self.started_at = time.time()
        self.prefill_kv: PrefillKvServer | None = None
        self.receiver: KvReceiver | None = None
        self._crash_timer: asyncio.TimerHandle | None = None

    # ----- lifecycle ---------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Start the scheduler and build the PD side (NIXL agents); needs the running loop."""
        s = self.settings
        self.scheduler.start()
        if s.mode == "prefill":
            self.prefill_kv = PrefillKvServer(
                server_info=self.prefill_server_info,
                is_ready=lambda: self.ready,
                modelled_transfer_s=self.modelled_transfer_s,
                on_transfer_done=self.metrics.observe_kv_transfer,
                transfer_mode=self.transfer_mode,
                endpoint_name=f"sim-prefill-{uuid.uuid4().hex[:12]}",
            )
        elif s.mode == "decode":
            self.receiver = KvReceiver(s.timeouts, self.transfer_mode, s.node, s.kv_buffer_mb * MIB, s.kv_verify,
                                       kv_layout=(s.spec.memory.page_size, s.spec.memory.kv_cache_dtype))
        self._arm_crash_timer()

    async def warm_up(self) -> None:
        """Load the tokenizer and wait out the simulated start-up; /health answers 503 until then."""
        s = self.settings
        started = time.monotonic()
        self.codec = await asyncio.get_running_loop().run_in_executor(None, TextCodec, s.model_path, s.model_preset)
        await asyncio.sleep(max(0.0, self.startup_s - (time.monotonic() - started)))
        self.ready = True
        log.info("The server is fired up and ready to roll! (simulated %s, %s)", s.engine_type, s.profile)

    async def stop(self) -> None:
        await self.scheduler.stop()
        if self.receiver is not None:
            await self.receiver.close()
        # the engine's own count, read after a run (e.g. to check an interrupted benchmark kept every finished prompt)
        log.info("stopped: %d requests finished, %d of them aborted", *self.metrics.finished_tally())

    def apply_faults(self, raw: str | dict) -> None:
        self.faults = FaultInjector(parse_fault_spec(raw))
        self._arm_crash_timer()

    def _arm_crash_timer(self) -> None:
        if self._crash_timer is not None:
            self._crash_timer.cancel()
            self._crash_timer = None
        at = self.faults.spec.crash_at_s
        if at is not None:
            self._crash_timer = asyncio.get_running_loop().call_later(at, crash, "crash_at_s")

    def unavailable(self) -> str | None:
        """Why the server cannot take requests now (503 on /generate and /health), or None: starting up, or its
        scheduler failed (the cause)."""
        if not self.ready:
            return "The server is starting up (simulated start-up delay)."
        return self.scheduler.failure

    # ----- facts ---------------------------------------------------------------------------------------------
    def modelled_transfer_s(self, prompt_tokens: int, decode_node: str | None) -> float:
        same_node = decode_node == self.settings.node
        seconds = self.cost.kv_transfer_s(prompt_tokens, same_node=same_node)
        return seconds * self.settings.time_scale * self.faults.step_factor

    def kv_bytes(self, prompt_tokens: int) -> int:
        """The request's KV size in the model (what the modelled transfer time charges)."""
        return prompt_tokens * self.cost.kv_bytes_per_token()

    def kv_payload_bytes(self, prompt_tokens: int) -> int:
        """The bytes that really move and get verified: all of the KV, or its first kv_sample_bytes."""
        full = self.kv_bytes(prompt_tokens)
        return full if self.settings.kv_payload == "full" else min(full, self.settings.kv_sample_bytes)

    def kv_payload_stats(self) -> dict[str, Any]:
        """What the KV transfers really moved against the model's bytes (prefill: sent; decode: verified)."""
        s = self.settings
        stats: dict[str, Any] = {"mode": s.kv_payload, "sample_bytes": s.kv_sample_bytes}
        if self.prefill_kv is not None:
            stats.update(transfers=self.prefill_kv.transfers, modelled_bytes=self.prefill_kv.modelled_bytes,
                         moved_bytes=self.prefill_kv.moved_bytes)
        if self.receiver is not None:
            stats.update(verified_transfers=self.receiver.verified_transfers,
                         received_bytes=self.receiver.received_bytes)
        return stats

    def prefill_server_info(self) -> dict[str, Any]:
        """The prefill bootstrap server's PrefillServerInfo (GET /route with every rank -1)."""
        s = self.settings
        p = s.spec.parallel
        return {
            "attn_tp_size": p.tp // (p.dp if p.dp_attention else 1),
            "attn_cp_size": 1,
            "dp_size": p.dp,
            "pp_size": p.pp,
            "page_size": s.spec.memory.page_size,
            "kv_cache_dtype": s.spec.memory.kv_cache_dtype,  # the decode refuses a pair whose dtypes differ
            "follow_bootstrap_room": True,
            "enable_dsa_cache_layer_split": False,
            "prefill_http_port": s.port,
            "target_tp_rank": None,
            "sim_kv_transfer": self.transfer_mode,
            "sim_host": s.host,
            "sim_bootstrap_port": s.bootstrap_port,
            "simulated": True,
        }

    # ----- requests ------------------------------------------------------------------------------------------
    def context_len(self) -> int:
        """SGLang's context length: --context-length, else the model's max_position_embeddings."""
        return self.settings.context_length or self.arch.max_position_embeddings

    def check_item(self, item: Item) -> None:
        s = self.settings
        self._check_context(len(item.input_ids), item.params)
        limit = self.scheduler.max_request_tokens()
        if len(item.input_ids) >= limit:
            raise BadRequest(
                f"The input ({len(item.input_ids)} tokens) is longer than the model's context length "
                f"({limit} tokens)."
            )
        if (unplaceable := self.scheduler.never_preallocated(len(item.input_ids))) is not None:
            raise BadRequest(unplaceable)
        vocab = self.arch.vocab_size
        outside = next((t for t in item.input_ids if t < 0 or t >= vocab), None)
        if outside is not None:  # SGLang's wording for out-of-vocabulary ids (tokenizer_manager.py)
            raise BadRequest(f"input_ids contains out-of-vocabulary token id {outside}; valid range is [0, {vocab}).")
        if s.mode != "null" and item.bootstrap_host != FAKE_BOOTSTRAP_HOST:
            if item.bootstrap_room is None:
                raise BadRequest(MISSING_ROOM)
            if s.mode == "decode" and not item.bootstrap_host:
                raise BadRequest("bootstrap_host is required on a decode server: the host of the prefill's bootstrap server")

    def _check_context(self, input_len: int, params: SamplingParams) -> None:
        """SGLang 0.5.17's TokenizerManager._validate_one_request, its words: the prompt below the context length, and
        prompt + a max_new_tokens the request sent within it (no --allow-auto-truncate: refused, not clamped)."""
        context = self.context_len()
        if input_len >= context:
            raise BadRequest(f"The input ({input_len} tokens) is longer than the model's context length "
                             f"({context} tokens).")
        max_new = params.max_new_tokens
        if "max_new_tokens" in params.model_fields_set and input_len + max_new > context:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {context} tokens. You "
                f"requested a total of {input_len + max_new} tokens: {input_len} tokens from the input messages and "
                f"{max_new} tokens for the completion. Please reduce the number of tokens in the input messages or "
                "the completion to fit within the limit.")

    def start_run(self, item: Item, fate: RequestFate, streaming: bool) -> Run:
        req = SimRequest(
            rid=item.rid,
            input_ids=item.input_ids,
            max_new_tokens=item.params.max_new_tokens,
            ignore_eos=item.params.ignore_eos,
            min_new_tokens=item.params.min_new_tokens,
            corrupt=fate.corrupt,
        )
        run = Run(item, req, streaming)
        self.runs.add(run)
        run.task = asyncio.get_running_loop().create_task(self._drive(run, fate))
        return run

    async def _drive(self, run: Run, fate: RequestFate) -> None:
        mode = self.settings.mode
        local = mode == "null" or run.item.bootstrap_host == FAKE_BOOTSTRAP_HOST
        if mode == "prefill":
            run.req.max_new_tokens = 1  # SGLang's prefill samples exactly the first token
        try:
            if local:
                await self.run_in_scheduler(run)
                await self.scheduler.release(run.req)  # a PD prefill holds KV for a transfer; a local run has none
            elif mode == "prefill":
                await drive_prefill(self, run, fate)
            else:
                await drive_decode(self, run)
        except asyncio.CancelledError:
            if run.submitted and not run.req.finished:
                self.scheduler.abort_request(run.req)
            if run.error is None and run.final_reason is None:
                run.final_reason = {"type": "abort", "message": "Abort before prefill" if not run.submitted
                                    else "Aborted by AbortReq."}
        except KvTransferError as exc:
            run.error = (500, str(exc))
        except Exception as exc:
            log.exception("request %s failed", run.item.rid)
            run.error = (500, f"simulated engine error: {exc}")
        finally:
            self._finish_run(run)

    async def run_in_scheduler(self, run: Run) -> None:
        """Submit the run's request to the scheduler and wait until it finishes."""
        self.scheduler.submit(run.req)
        run.submitted = True
        await run.req.finished_event.wait()

    def _finish_run(self, run: Run) -> None:
        req = run.req
        failure = self.scheduler.failure
        if run.error is None and failure is not None and (req.finish_reason or {}).get("message") == failure:
            run.error = (500, failure)
        req.finished_at = req.finished_at or time.monotonic()
        self.runs.discard(run)
        run.done.set()
        req.updated.set()
        if run.item.rid.startswith("HEALTH_CHECK_"):
            return  # SGLang's health probe sets log_metrics=False
        ttft = (req.first_token_at - req.created_at) if req.first_token_at else None
        self.metrics.observe_finished(
            streaming=run.streaming,
            prompt_tokens=req.prompt_len,
            completion_tokens=len(req.output_ids),
            ttft_s=ttft,
            e2e_s=req.finished_at - req.created_at,
            aborted=(run.finish_reason or {}).get("type") == "abort",
        )

    async def until_done(self, runs: list[Run]) -> None:
        """Wait for `runs` to end; a handler cancelled meanwhile (its client disconnected) aborts them first, as
        SGLang aborts a non-streamed request whose client left (it checks every SGLANG_REQUEST_STATE_WAIT_TIMEOUT,
        4 s; the sim at once)."""
        try:
            await asyncio.gather(*(run.done.wait() for run in runs))
        except asyncio.CancelledError:
            self.abort_unfinished(runs)
            raise

    def abort_unfinished(self, runs: list[Run]) -> None:
        """Abort those of `runs` still going (their client went away, as SGLang does on a disconnect)."""
        for run in runs:
            if not run.done.is_set():
                self.abort(run.item.rid, abort_all=False)

    def abort(self, rid: str, abort_all: bool) -> int:
        """SGLang's /abort_request: rid prefix match over every queue (bootstrap, transfer, scheduler)."""
        matched = [r for r in self.runs if abort_all or (rid and r.item.rid.startswith(rid))]
        for run in matched:
            if run.task is not None:
                run.task.cancel()
        return len(matched)

    def response(self, run: Run, text_ids: list[int] | None = None) -> dict[str, Any]:
        """SGLang's answer for a run; `text_ids`: the ids a stream chunk carries (all so far, or only new ones)."""
        req = run.req
        ids = req.output_ids if text_ids is None else text_ids
        end = req.finished_at or time.monotonic()
        return {
            "text": self._text(run, ids),
            "output_ids": list(ids),
            "meta_info": {
                "id": run.item.rid,
                "finish_reason": run.finish_reason if run.done.is_set() else None,
                "prompt_tokens": req.prompt_len,
                "completion_tokens": len(req.output_ids),
                "cached_tokens": run.cached_tokens,
                "reasoning_tokens": 0,
                "weight_version": "default",
                "num_retractions": 0,
                "e2e_latency": end - req.created_at,
                "simulated": True,
            },
        }


    def _text(self, run: Run, ids: list[int]) -> str:
        """Text of `ids`. A run's cumulative text is detokenized incrementally while it streams, as SGLang's
        detokenizer does (re-decoding every id for every chunk made long streams quadratic: 40 % of a
        decode server's CPU); a finished run's text, and a chunk of only new ids, are decoded whole."""
        if self.codec is None:
            return ""
        if run.done.is_set() or len(ids) != len(run.req.output_ids):
            return self.codec.decode(ids)
        return run.detok.update(self.codec, ids)

