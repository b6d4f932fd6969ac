"""Simulated SGLang engine server: one process is one worker speaking SGLang 0.5.17's HTTP API.

argv -> SimSettings -> SimEngine (scheduler + metrics + faults + PD transfer) -> aiohttp app on --port
        (+ on a prefill: the bootstrap app on --disaggregation-bootstrap-port, see kv_transfer.py)

Every answer is labelled simulated (`meta_info.simulated`, `/server_info.simulated`, `sglang:simulated`).
Run one by hand: `pd-orchestrator sim-server --mode prefill --port 30000` or `python -m orchestrator.sim.server`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.model_presets import MODEL_PRESETS, ModelArchitecture
from orchestrator.sim.costmodel import GPU_SPECS, EngineCostModel, gpu_spec
from orchestrator.sim.faults import FaultInjector, FaultSpecError, RequestFate, parse_fault_spec
from orchestrator.sim.kv_transfer import (
    MIB,
    KvAux,
    KvReceiver,
    KvTransferError,
    PdTimeouts,
    PrefillKvServer,
    resolve_transfer_mode,
)
from orchestrator.sim.metrics import CONTENT_TYPE, MetricLabels, PdQueueSizes, SimMetrics
from orchestrator.sim.scheduler import Scheduler, SchedulerLimits, SimRequest

log = logging.getLogger("orchestrator.sim.server")

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's warm-up/health host: no peer, no transfer
SGLANG_VERSION = "0.5.17"
MISSING_ROOM = "Invalid request: Disaggregated request received without bootstrap room id."
FLUSH_NOTE = "Please check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)"


# ----- settings ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimSettings:
    """Everything one simulated server needs, from its command line."""

    host: str
    port: int
    mode: str  # null | prefill | decode
    bootstrap_port: int
    model_preset: str | None
    model_path: str | None
    served_model_name: str
    quantization: str
    profile: str
    gpu_memory_gb: float | None
    tp: int
    dp: int
    ep: int
    dp_attention: bool
    nnodes: int
    max_running_requests: int | None
    chunked_prefill_size: int | None
    mem_fraction_static: float | None
    context_length: int | None
    efficiency_prefill: float
    efficiency_decode: float
    time_scale: float
    startup_s: float | None
    faults: str | None
    kv_transfer: str
    kv_buffer_mb: int
    kv_verify: str
    node: str
    incremental_streaming_output: bool
    timeouts: PdTimeouts

    @property
    def engine_type(self) -> str:
        return {"null": "unified"}.get(self.mode, self.mode)

    @property
    def role(self) -> str:
        return {"null": "aggregated"}.get(self.mode, self.mode)


def architecture_of(settings: SimSettings) -> ModelArchitecture:
    if settings.model_preset:
        if settings.model_preset not in MODEL_PRESETS:
            raise ValueError(f"--model-preset={settings.model_preset!r}; allowed: {sorted(MODEL_PRESETS)}")
        return MODEL_PRESETS[settings.model_preset]
    if not settings.model_path:
        raise ValueError("set --model-preset NAME or --model-path DIR (a directory with config.json)")
    path = os.path.join(settings.model_path, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"--model-path={settings.model_path!r} has no config.json; point it at a model directory")
    return ModelArchitecture.from_hf_config(path)  # type: ignore[arg-type]


def cost_model_of(settings: SimSettings, arch: ModelArchitecture) -> EngineCostModel:
    cost = EngineCostModel(
        arch=arch,
        gpu=gpu_spec(settings.profile, settings.gpu_memory_gb),
        tp=settings.tp,
        dp=settings.dp,
        ep=settings.ep,
        quantization=settings.quantization,
        efficiency_prefill=settings.efficiency_prefill,
        efficiency_decode=settings.efficiency_decode,
        max_running_requests=settings.max_running_requests,
        dp_attention=settings.dp_attention,
        nnodes=settings.nnodes,
        role=settings.role,
        context_length=settings.context_length,
    )
    if settings.mem_fraction_static is not None:
        cost.mem_fraction_static = settings.mem_fraction_static
    if settings.chunked_prefill_size:
        cost.chunked_prefill_tokens = settings.chunked_prefill_size
    return cost


# ----- text <-> ids ----------------------------------------------------------------------------------------
class TextCodec:
    """The model's tokenizer (orchestrator.tokenizer) when it loads, else bytes (labelled in /server_info)."""

    def __init__(self, model_path: str | None):
        self.kind = "bytes"
        self._tok: Any = None
        try:
            from orchestrator.tokenizer import load_tokenizer

            self._tok = load_tokenizer(model_path)
            self.kind = "tokenizer"
        except Exception as exc:  # no tokenizer available must not stop a simulator; ids still work
            log.warning("tokenizer unavailable (%s); text prompts are tokenized as UTF-8 bytes", exc)

    def encode(self, text: str) -> list[int]:
        if self._tok is not None:
            return list(self._tok.encode(text))
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        if self._tok is not None:
            try:
                return self._tok.decode(ids)
            except Exception:
                pass
        return bytes(i % 256 for i in ids).decode("utf-8", errors="replace")


# ----- request bodies -------------------------------------------------------------------------------------
class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="allow")
    max_new_tokens: int = Field(128, ge=0)
    ignore_eos: bool = False
    temperature: float = Field(1.0, ge=0)  # accepted; outputs are deterministic (dummy weights, greedy-like)


class GenerateBody(BaseModel):
    """The /generate fields the simulator uses; others are accepted and ignored, as SGLang ignores unused ones."""

    model_config = ConfigDict(extra="allow")
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SamplingParams | list[SamplingParams] | None = None
    rid: str | list[str] | None = None
    stream: bool = False
    bootstrap_host: str | list[str | None] | None = None
    bootstrap_port: int | list[int | None] | None = None
    bootstrap_room: int | list[int | None] | None = None


@dataclass
class Item:
    """One prompt of a /generate call, normalised."""

    index: int
    rid: str
    input_ids: list[int]
    params: SamplingParams
    bootstrap_host: str | None
    bootstrap_port: int | None
    bootstrap_room: int | None


class BadRequest(ValueError):
    """A 400 with SGLang's error body."""


def _pick(value: Any, i: int) -> Any:
    return value[i] if isinstance(value, list) else value


def normalise(body: GenerateBody, codec: TextCodec) -> tuple[list[Item], bool]:
    """Body -> items (batch or single) as SGLang's GenerateReqInput normalises them."""
    if (body.text is None) == (body.input_ids is None):
        raise BadRequest("Either text or input_ids should be provided (exactly one of them).")
    if body.text is not None:
        is_batch = isinstance(body.text, list)
        prompts = [codec.encode(t) for t in (body.text if is_batch else [body.text])]  # type: ignore[union-attr]
    else:
        ids = body.input_ids or []
        is_batch = bool(ids) and isinstance(ids[0], list)
        prompts = ids if is_batch else [ids]  # type: ignore[assignment]
    n = len(prompts)
    for name in ("sampling_params", "rid", "bootstrap_host", "bootstrap_port", "bootstrap_room"):
        value = getattr(body, name)
        if isinstance(value, list) and name != "sampling_params" and len(value) != n:
            raise BadRequest(f"{name} has {len(value)} entries but the batch has {n} prompts")
    if isinstance(body.sampling_params, list) and len(body.sampling_params) != n:
        raise BadRequest(f"sampling_params has {len(body.sampling_params)} entries but the batch has {n} prompts")
    items = []
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise BadRequest(f"prompt {i} is empty; send at least one token")
        room = body.bootstrap_room
        room_i = room + i if isinstance(room, int) else _pick(room, i)  # scalar room -> room + i, as SGLang
        rid = _pick(body.rid, i)
        if rid is None:
            rid = uuid.uuid4().hex
        elif isinstance(body.rid, str) and is_batch:
            rid = f"{rid}_{i}"
        items.append(
            Item(
                index=i,
                rid=rid,
                input_ids=list(prompt),
                params=_pick(body.sampling_params, i) or SamplingParams(),
                bootstrap_host=_pick(body.bootstrap_host, i),
                bootstrap_port=_pick(body.bootstrap_port, i),
                bootstrap_room=room_i,
            )
        )
    return items, is_batch


def sglang_error(status: int, message: str) -> web.Response:
    """SGLang's error bodies: 400 -> {"error": {"message"}}, 5xx -> the OpenAI-style error object."""
    if status == 400:
        return web.json_response({"error": {"message": message}}, status=400)
    return web.json_response(
        {"object": "error", "message": message, "type": str(status), "param": None, "code": status}, status=status
    )


# ----- the engine -----------------------------------------------------------------------------------------
@dataclass(eq=False)
class Run:
    """One item in flight: its scheduler request, the task driving its PD phases, and its end."""

    item: Item
    req: SimRequest
    streaming: bool
    done: asyncio.Event = field(default_factory=asyncio.Event)
    error: tuple[int, str] | None = None  # (HTTP status, message) when it failed
    final_reason: dict | None = None  # overrides the scheduler's (PD prefill: length 0)
    cached_tokens: int = 0
    submitted: bool = False
    task: asyncio.Task | None = None

    @property
    def finish_reason(self) -> dict | None:
        if self.error is not None:
            return {"type": "abort", "message": self.error[1], "status_code": self.error[0], "err_type": None}
        return self.final_reason or self.req.finish_reason


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
                f"{self.cost.weights_bytes_per_gpu() / 2**30:.1f} GiB per GPU at tp={settings.tp}, more than "
                f"{self.cost.mem_fraction_static:.2f} x {self.cost.gpu.memory_gb:g} GiB of {settings.profile}: "
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
            SchedulerLimits(
                max_running_requests=self.cost.max_running(),
                kv_capacity_tokens=capacity,
                chunked_prefill_tokens=self.cost.chunked_prefill_tokens,
                time_scale=settings.time_scale,
            ),
            vocab_size=self.arch.vocab_size,
            eos_token_id=self.arch.eos_token_id,
            slow_factor=lambda: self.faults.step_factor,
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
            self.receiver = KvReceiver(s.timeouts, self.transfer_mode, s.node, s.kv_buffer_mb * MIB, s.kv_verify)
        self._arm_crash_timer()

    async def warm_up(self) -> None:
        """Load the tokenizer and wait out the simulated start-up; /health answers 503 until then."""
        s = self.settings
        started = time.monotonic()
        self.codec = await asyncio.get_running_loop().run_in_executor(None, TextCodec, s.model_path)
        await asyncio.sleep(max(0.0, self.startup_s - (time.monotonic() - started)))
        self.ready = True
        log.info("The server is fired up and ready to roll! (simulated %s, %s)", s.engine_type, s.profile)

    async def stop(self) -> None:
        await self.scheduler.stop()
        if self.receiver is not None:
            await self.receiver.close()

    def apply_faults(self, raw: str | dict) -> None:
        self.faults = FaultInjector(parse_fault_spec(raw))
        self._arm_crash_timer()

    def _arm_crash_timer(self) -> None:
        if self._crash_timer is not None:
            self._crash_timer.cancel()
            self._crash_timer = None
        at = self.faults.spec.crash_at_s
        if at is not None:
            self._crash_timer = asyncio.get_running_loop().call_later(at, _crash, "crash_at_s")

    # ----- facts ---------------------------------------------------------------------------------------------
    def modelled_transfer_s(self, prompt_tokens: int, decode_node: str | None) -> float:
        same_node = decode_node == self.settings.node
        seconds = self.cost.kv_transfer_s(prompt_tokens, same_node=same_node)
        return seconds * self.settings.time_scale * self.faults.step_factor

    def kv_bytes(self, prompt_tokens: int) -> int:
        return prompt_tokens * self.cost.kv_bytes_per_token()

    def prefill_server_info(self) -> dict[str, Any]:
        s = self.settings
        return {
            "attn_tp_size": s.tp // (s.dp if s.dp_attention else 1),
            "attn_cp_size": 1,
            "dp_size": s.dp,
            "pp_size": 1,
            "page_size": 1,
            "kv_cache_dtype": "auto",
            "follow_bootstrap_room": True,
            "enable_dsa_cache_layer_split": False,
            "prefill_http_port": s.port,
            "target_tp_rank": None,
            "sim_kv_transfer": self.transfer_mode,
            "sim_host": s.host,
            "sim_bootstrap_port": s.bootstrap_port,
            "simulated": True,
        }

    def server_info(self) -> dict[str, Any]:
        s = self.settings
        stats = self.scheduler.stats()
        args = {
            "model_path": s.model_path or s.model_preset,
            "served_model_name": s.served_model_name,
            "host": s.host,
            "port": s.port,
            "disaggregation_mode": s.mode,
            "disaggregation_bootstrap_port": s.bootstrap_port,
            "disaggregation_transfer_backend": "nixl",
            "tp_size": s.tp,
            "dp_size": s.dp,
            "ep_size": s.ep,
            "enable_dp_attention": s.dp_attention,
            "nnodes": s.nnodes,
            "quantization": s.quantization,
            "max_running_requests": self.scheduler.limits.max_running_requests,
            "chunked_prefill_size": self.scheduler.limits.chunked_prefill_tokens,
            "mem_fraction_static": self.cost.mem_fraction_static,
            "context_length": s.context_length or self.arch.max_position_embeddings,
            "page_size": 1,
            "kv_cache_dtype": "auto",
            "load_format": "dummy",
            "enable_metrics": True,
        }
        startup_time = {**self.startup_phases, "cuda_graph": {"decode": self.startup_phases["cuda_graph"]}}
        memory = {
            "weight": self.cost.weights_bytes_per_gpu() / 2**30,
            "kvcache": self.cost.kv_bytes_per_gpu() / 2**30,
            "token_capacity": stats.kv_capacity_tokens,
            "graph": 0.0,
        }
        return {
            **args,
            "scheduler_info": {
                "max_total_num_tokens": stats.kv_capacity_tokens,
                "max_req_input_len": stats.kv_capacity_tokens - 1,
            },
            "max_total_num_tokens": stats.kv_capacity_tokens,
            "startup_time": startup_time,
            "internal_states": [
                {
                    **args,
                    "last_gen_throughput": stats.gen_throughput,
                    "memory_usage": memory,
                    "startup_time": startup_time,
                    "effective_max_running_requests_per_dp": self.scheduler.limits.max_running_requests,
                }
            ],
            "version": f"{SGLANG_VERSION}-sim",
            "kv_events": None,
            "simulated": True,
            "sim": {
                "profile": s.profile,
                "time_scale": s.time_scale,
                "kv_transfer": self.transfer_mode,
                "kv_bytes_per_token": self.cost.kv_bytes_per_token(),
                "tokenizer": self.codec.kind if self.codec else "loading",
                "node": s.node,
                "faults": self.faults.describe(),
            },
        }

    # ----- requests ------------------------------------------------------------------------------------------
    def check_item(self, item: Item) -> None:
        s = self.settings
        limit = self.scheduler.max_request_tokens()
        if len(item.input_ids) >= limit:
            raise BadRequest(
                f"The input ({len(item.input_ids)} tokens) is longer than the model's context length "
                f"({limit} tokens)."
            )
        if any(t < 0 or t >= self.arch.vocab_size for t in item.input_ids):
            raise BadRequest(f"input_ids must be token ids in [0, {self.arch.vocab_size})")
        if s.mode != "null" and item.bootstrap_host != FAKE_BOOTSTRAP_HOST:
            if item.bootstrap_room is None:
                raise BadRequest(MISSING_ROOM)
            if s.mode == "decode" and not item.bootstrap_host:
                raise BadRequest("bootstrap_host is required on a decode server: the host of the prefill's bootstrap server")

    def start_run(self, item: Item, fate: RequestFate, streaming: bool) -> Run:
        req = SimRequest(
            rid=item.rid,
            input_ids=item.input_ids,
            max_new_tokens=item.params.max_new_tokens,
            ignore_eos=item.params.ignore_eos,
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
                await self._run_in_scheduler(run)
            elif mode == "prefill":
                await self._drive_prefill(run, fate)
            else:
                await self._drive_decode(run)
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

    async def _run_in_scheduler(self, run: Run) -> None:
        self.scheduler.submit(run.req)
        run.submitted = True
        await run.req.finished_event.wait()

    async def _drive_prefill(self, run: Run, fate: RequestFate) -> None:
        assert self.prefill_kv is not None
        room_id = int(run.item.bootstrap_room)  # type: ignore[arg-type]
        room = self.prefill_kv.room(room_id)
        run.req.hold_kv = True  # its KV stays allocated until the transfer ends
        try:
            self.queues.prefill_bootstrap += 1
            try:
                await asyncio.wait_for(room.handshaken.wait(), self.settings.timeouts.bootstrap_timeout_s)
            except asyncio.TimeoutError:
                self.metrics.bootstrap_failed()
                raise KvTransferError(
                    "bootstrap",
                    f"Prefill bootstrap failed for request rank=0 (bootstrap_room={room_id}): no decode handshake "
                    f"within {self.settings.timeouts.bootstrap_timeout_s:g} s",
                ) from None
            finally:
                self.queues.prefill_bootstrap -= 1
            await self._run_in_scheduler(run)
            if run.req.aborted:
                return
            self.queues.prefill_inflight += 1
            try:
                if not fate.hang_transfer:
                    aux = KvAux(run.req.output_ids[0], run.req.prompt_len, 0, self.kv_bytes(run.req.prompt_len))
                    room.kv_ready.set_result(aux)
                try:
                    await asyncio.shield(room.done)
                except KvTransferError:
                    self.metrics.transfer_failed()
                    raise
                run.final_reason = {"type": "length", "length": 0}
                run.req.finished_at = time.monotonic()  # the prefill's request ends with its transfer
            finally:
                self.queues.prefill_inflight -= 1
        finally:
            room.fail("prefill request ended before the transfer")  # no-op once the transfer completed
            self.prefill_kv.drop(room_id)
            await self.scheduler.release(run.req)

    async def _drive_decode(self, run: Run) -> None:
        assert self.receiver is not None
        item = run.item
        addr = f"http://{_url_host(item.bootstrap_host)}:{item.bootstrap_port or self.settings.bootstrap_port}"
        room = int(item.bootstrap_room)  # type: ignore[arg-type]
        reserved = 0
        self.queues.decode_prealloc += 1
        in_prealloc = True
        try:
            try:
                await self.receiver.connect(addr, room)
            except KvTransferError:
                self.metrics.bootstrap_failed()
                raise
            reserve = self.scheduler.kv_reserve_tokens(run.req.prompt_len, run.req.max_new_tokens)
            await self.scheduler.reserve_kv(reserve)
            reserved = reserve
            self.queues.decode_prealloc -= 1
            in_prealloc = False
            self.queues.decode_transfer += 1
            try:
                aux = await self.receiver.fetch(addr, room, item.rid)
            except KvTransferError:
                self.metrics.transfer_failed()
                raise
            finally:
                self.queues.decode_transfer -= 1
            run.cached_tokens = aux.cached_tokens
            run.req.first_token = aux.first_token
            run.req.kv_prereserved = True
            run.req.kv_tokens, reserved = reserved, 0  # ownership moves to the scheduler request
            await self._run_in_scheduler(run)
        finally:
            if in_prealloc:
                self.queues.decode_prealloc -= 1
            if reserved:
                await self.scheduler.release_kv(reserved)

    def _finish_run(self, run: Run) -> None:
        req = run.req
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

    def abort(self, rid: str, abort_all: bool) -> int:
        """SGLang's /abort_request: rid prefix match over every queue (bootstrap, transfer, scheduler)."""
        matched = [r for r in self.runs if abort_all or (rid and r.item.rid.startswith(rid))]
        for run in matched:
            if run.task is not None:
                run.task.cancel()
        return len(matched)

    def response(self, run: Run, text_ids: list[int] | None = None) -> dict[str, Any]:
        req = run.req
        ids = req.output_ids if text_ids is None else text_ids
        end = req.finished_at or time.monotonic()
        return {
            "text": self.codec.decode(ids) if self.codec else "",
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


def _field_path(loc: tuple) -> str:
    """pydantic's error location without its union-branch tags ('input_ids.list[int].0' -> 'input_ids.0')."""
    parts = [str(p) for p in loc if isinstance(p, int) or (p[:1].islower() and "[" not in p)]
    return ".".join(parts) or "(body: expected a JSON object)"


def _url_host(host: str | None) -> str:
    return f"[{host}]" if host and ":" in host and not host.startswith("[") else str(host)


async def _wait_event(event: asyncio.Event) -> None:
    await event.wait()
    event.clear()


def _crash(reason: str) -> None:
    """A fault-injected crash: no cleanup, no goodbye, like a killed process (exit code 137)."""
    log.error("simulated crash (%s)", reason)
    logging.shutdown()
    os._exit(137)


async def _hang_forever() -> None:
    await asyncio.Event().wait()


# ----- HTTP -----------------------------------------------------------------------------------------------
class SimHttpApi:
    """Thin aiohttp handlers over a SimEngine."""

    def __init__(self, engine: SimEngine):
        self.engine = engine

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * MIB)
        r = app.router
        r.add_post("/generate", self.generate)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health_generate)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/ping", self.health)
        r.add_post("/abort_request", self.abort_request)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_get("/metrics", self.metrics)
        r.add_get("/sim/faults", self.get_faults)
        r.add_post("/sim/faults", self.post_faults)
        return app

    async def generate(self, request: web.Request) -> web.StreamResponse:
        e = self.engine
        if not e.ready:
            return sglang_error(503, "The server is starting up (simulated start-up delay).")
        fate = e.faults.on_request()
        if fate.crash:
            _crash("crash_after_requests")
        if fate.hang:
            await _hang_forever()
        try:
            body = GenerateBody.model_validate(await request.json())
            items, is_batch = normalise(body, e.codec)  # type: ignore[arg-type]
            for item in items:
                e.check_item(item)
        except json.JSONDecodeError as exc:
            return sglang_error(400, f"Request body is not valid JSON: {exc.msg}")
        except ValidationError as exc:
            first = exc.errors()[0]
            return sglang_error(400, f"Invalid request field {_field_path(first['loc'])}: {first['msg']}")
        except BadRequest as exc:
            return sglang_error(400, str(exc))
        if fate.error:
            return sglang_error(500, "Simulated fault (error_rate): internal server error.")
        runs = [e.start_run(item, fate, body.stream) for item in items]
        if body.stream:
            return await self._stream(request, runs)
        await asyncio.gather(*(run.done.wait() for run in runs))
        for run in runs:
            if run.error is not None:
                return sglang_error(*run.error)
        outs = [e.response(run) for run in runs]
        return web.json_response(outs if is_batch else outs[0])

    async def _stream(self, request: web.Request, runs: list[Run]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        incremental = self.engine.settings.incremental_streaming_output

        async def pump(run: Run) -> None:
            sent = 0
            while True:
                if len(run.req.output_ids) > sent and run.req.finished:
                    await run.done.wait()  # the last tokens go out with the finish_reason, in one chunk
                finished = run.done.is_set()
                new = len(run.req.output_ids) > sent
                if new or finished:
                    ids = run.req.output_ids[sent:] if incremental else run.req.output_ids
                    out = self.engine.response(run, text_ids=list(ids))
                    if len(runs) > 1:
                        out["index"] = run.item.index
                    await resp.write(f"data: {json.dumps(out)}\n\n".encode())
                    sent = len(run.req.output_ids)
                if finished:
                    return
                await _wait_event(run.req.updated)

        await asyncio.gather(*(pump(run) for run in runs))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def health(self, request: web.Request) -> web.Response:
        if not self.engine.ready:
            return web.Response(status=503)
        if self.engine.faults.hangs_health:
            await _hang_forever()
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        """A one-token generation through the scheduler (PD: the fake bootstrap host, no peer needed)."""
        e = self.engine
        if not e.ready:
            return web.Response(status=503)
        if e.faults.hangs_health:
            await _hang_forever()
        item = Item(0, f"HEALTH_CHECK_{uuid.uuid4().hex}", [0], SamplingParams(max_new_tokens=1),
                    FAKE_BOOTSTRAP_HOST, None, 0)
        run = e.start_run(item, RequestFate(), streaming=False)
        try:
            await asyncio.wait_for(run.done.wait(), 20.0)
        except asyncio.TimeoutError:
            e.abort(item.rid, abort_all=False)
            return web.Response(status=503)
        return web.Response(status=200 if run.error is None else 503)

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.engine.server_info())

    async def model_info(self, request: web.Request) -> web.Response:
        s = self.engine.settings
        return web.json_response(
            {
                "model_path": s.model_path or s.model_preset,
                "tokenizer_path": s.model_path or s.model_preset,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "deepseek_v3",
                "architectures": ["DeepseekV3ForCausalLM"],
                "simulated": True,
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        s = self.engine.settings
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": s.served_model_name,
                        "object": "model",
                        "created": int(self.engine.started_at),
                        "owned_by": "sglang",
                        "root": s.model_path or s.model_preset,
                        "max_model_len": s.context_length or self.engine.arch.max_position_embeddings,
                    }
                ],
            }
        )

    async def abort_request(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return sglang_error(400, "abort_request expects a JSON body {\"rid\": ..., \"abort_all\": false}")
        self.engine.abort(str(body.get("rid") or ""), bool(body.get("abort_all", False)))
        return web.Response(status=200)

    async def flush_cache(self, request: web.Request) -> web.Response:
        if not self.engine.scheduler.idle() or self.engine.runs:
            return web.Response(status=400, text=f"Cache not flushed. {FLUSH_NOTE}")
        return web.Response(status=200, text=f"Cache flushed.\n{FLUSH_NOTE}")

    async def metrics(self, request: web.Request) -> web.Response:
        e = self.engine
        e.metrics.refresh(e.scheduler.stats(), e.queues)
        return web.Response(body=e.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.engine.faults.describe())

    async def post_faults(self, request: web.Request) -> web.Response:
        try:
            self.engine.apply_faults(await request.text())
        except FaultSpecError as exc:
            return sglang_error(400, str(exc))
        return web.json_response(self.engine.faults.describe())


# ----- process ----------------------------------------------------------------------------------------------
async def serve(settings: SimSettings) -> None:
    """Bind the API (and the prefill's bootstrap server), simulate start-up, serve until SIGTERM/SIGINT."""
    engine = SimEngine(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runners: list[web.AppRunner] = []
    engine.prepare()
    starting = loop.create_task(engine.warm_up())
    try:
        await _bind(runners, SimHttpApi(engine).app(), settings.host, settings.port)
        if engine.prefill_kv is not None:
            await _bind(runners, engine.prefill_kv.app(), settings.host, settings.bootstrap_port)
        log.info("simulated %s server on http://%s:%d (bootstrap port %s, kv transfer %s)", settings.engine_type,
                 settings.host, settings.port, settings.bootstrap_port if settings.mode == "prefill" else "-",
                 engine.transfer_mode)
        await stop.wait()
    finally:
        starting.cancel()
        for runner in runners:
            await runner.cleanup()
        await engine.stop()


async def _bind(runners: list[web.AppRunner], app: web.Application, host: str, port: int) -> None:
    # in-flight requests (a hung one never ends) get 2 s after SIGTERM, like a server that is going away
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    runners.append(runner)
    await web.TCPSite(runner, host, port, reuse_address=True, backlog=2048).start()  # uvicorn default, as SGLang


def add_server_args(p: argparse.ArgumentParser) -> None:
    """Flags: SGLang's names where SGLang has the flag, sim-only ones otherwise."""
    g = p.add_argument_group("SGLang flags")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=30000)
    g.add_argument("--disaggregation-mode", "--mode", dest="mode", choices=["null", "prefill", "decode"], default="null")
    g.add_argument("--disaggregation-bootstrap-port", dest="bootstrap_port", type=int, default=8998)
    g.add_argument("--disaggregation-transfer-backend", default="nixl", help="accepted; the sim moves KV per --kv-transfer")
    g.add_argument("--model-path", default=None, help="model directory with config.json (and tokenizer.json)")
    g.add_argument("--served-model-name", default=None)
    g.add_argument("--tp-size", "--tp", dest="tp", type=int, default=1)
    g.add_argument("--dp-size", "--dp", dest="dp", type=int, default=1)
    g.add_argument("--ep-size", "--ep", dest="ep", type=int, default=1)
    g.add_argument("--enable-dp-attention", action="store_true")
    g.add_argument("--nnodes", type=int, default=1)
    g.add_argument("--max-running-requests", type=int, default=None)
    g.add_argument("--chunked-prefill-size", type=int, default=None)
    g.add_argument("--mem-fraction-static", type=float, default=None)
    g.add_argument("--context-length", type=int, default=None)
    g.add_argument("--quantization", default="fp8", help="weight format: bf16, fp8, w4a8, awq")
    g.add_argument("--incremental-streaming-output", action="store_true")
    for flag in ("--enable-metrics", "--trust-remote-code", "--skip-server-warmup"):
        g.add_argument(flag, action="store_true", help="accepted for compatibility")
    for flag in ("--page-size", "--kv-cache-dtype", "--load-format", "--node-rank", "--dist-init-addr", "--base-gpu-id"):
        g.add_argument(flag, default=None, help="accepted for compatibility")
    s = p.add_argument_group("simulator flags")
    s.add_argument("--model-preset", default=None, help=f"architecture preset: {sorted(MODEL_PRESETS)}")
    s.add_argument("--profile", default="H100-SXM", choices=sorted(GPU_SPECS), help="cost-model GPU profile")
    s.add_argument("--gpu-memory-gb", type=float, default=None)
    s.add_argument("--efficiency-prefill", type=float, default=0.45)
    s.add_argument("--efficiency-decode", type=float, default=0.6)
    s.add_argument("--time-scale", type=float, default=1.0, help="multiply every simulated duration")
    s.add_argument("--startup-s", type=float, default=None, help="start-up delay; default cost model x time scale")
    s.add_argument("--faults", default=None, help="fault spec JSON, see docs/simulator.md")
    s.add_argument("--kv-transfer", choices=["auto", "nixl", "http"], default="auto")
    s.add_argument("--kv-buffer-mb", type=int, default=64, help="decode receive buffer (MiB), 8 MiB per transfer")
    s.add_argument("--kv-verify", choices=["full", "sampled"], default="full",
                   help="decode checks every received KV byte, or 64 bytes of every 4 KiB")
    s.add_argument("--sim-node", default=None, help="node identity for same-node transfers; default --host")
    d = PdTimeouts()
    s.add_argument("--waiting-timeout-s", type=float, default=d.waiting_timeout_s)
    s.add_argument("--bootstrap-timeout-s", type=float, default=d.bootstrap_timeout_s)
    s.add_argument("--heartbeat-interval-s", type=float, default=d.heartbeat_interval_s)
    s.add_argument("--heartbeat-max-failures", type=int, default=d.heartbeat_max_failures)
    s.add_argument("--bootstrap-retries", type=int, default=d.bootstrap_retries)
    s.add_argument("--bootstrap-retry-interval-s", type=float, default=d.bootstrap_retry_interval_s)
    s.add_argument("--log-level", default="info")


def settings_from_args(a: argparse.Namespace) -> SimSettings:
    preset = a.model_preset or (None if a.model_path else "DeepSeek-R1")
    for name in ("tp", "dp", "ep", "nnodes", "kv_buffer_mb", "bootstrap_retries", "heartbeat_max_failures"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(a, name)}: must be >= 1")
    for name in ("time_scale", "waiting_timeout_s", "bootstrap_timeout_s", "heartbeat_interval_s"):
        if getattr(a, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(a, name)}: must be > 0")
    return SimSettings(
        host=a.host,
        port=a.port,
        mode=a.mode,
        bootstrap_port=a.bootstrap_port,
        model_preset=preset,
        model_path=a.model_path,
        served_model_name=a.served_model_name or preset or os.path.basename(os.path.normpath(a.model_path)),
        quantization=a.quantization,
        profile=a.profile,
        gpu_memory_gb=a.gpu_memory_gb,
        tp=a.tp,
        dp=a.dp,
        ep=a.ep,
        dp_attention=a.enable_dp_attention,
        nnodes=a.nnodes,
        max_running_requests=a.max_running_requests,
        chunked_prefill_size=a.chunked_prefill_size,
        mem_fraction_static=a.mem_fraction_static,
        context_length=a.context_length,
        efficiency_prefill=a.efficiency_prefill,
        efficiency_decode=a.efficiency_decode,
        time_scale=a.time_scale,
        startup_s=a.startup_s,
        faults=a.faults,
        kv_transfer=a.kv_transfer,
        kv_buffer_mb=a.kv_buffer_mb,
        kv_verify=a.kv_verify,
        node=a.sim_node or a.host,
        incremental_streaming_output=a.incremental_streaming_output,
        timeouts=PdTimeouts(
            bootstrap_retries=a.bootstrap_retries,
            bootstrap_retry_interval_s=a.bootstrap_retry_interval_s,
            heartbeat_interval_s=a.heartbeat_interval_s,
            heartbeat_max_failures=a.heartbeat_max_failures,
            waiting_timeout_s=a.waiting_timeout_s,
            bootstrap_timeout_s=a.bootstrap_timeout_s,
        ),
    )


def run_server(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s sim-%(process)d %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = settings_from_args(args)
        parse_fault_spec(settings.faults)
        SimEngine(settings)  # fail fast, before binding ports, on a model that does not fit etc.
    except (ValueError, FaultSpecError) as exc:
        print(f"sim-server: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(settings))
    except OSError as exc:
        print(f"sim-server: cannot listen on {settings.host}:{settings.port} "
              f"(or bootstrap port {settings.bootstrap_port}): {exc}", file=sys.stderr)
        return 2
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim-server", help="run one simulated SGLang engine server (prefill, decode or aggregated)")
    add_server_args(p)
    p.set_defaults(func=run_server)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.sim.server", description=__doc__)
    add_server_args(parser)
    return run_server(parser.parse_args(argv))


if __name__ == "__main__":
    # Run the importable copy of this module, not __main__: pydantic resolves the body models' annotations
    # through sys.modules[their __module__], which under runpy/cProfile is not this file.
    from orchestrator.sim.server import main as _main

    raise SystemExit(_main())
