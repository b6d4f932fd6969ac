"""Simulated SGLang engine server: one process is one worker speaking SGLang 0.5.17's HTTP API.

argv -> SimSettings (a ServerSpec parsed from SGLang's flags + sim-only knobs) -> SimEngine (scheduler + metrics + faults + PD transfer) -> aiohttp app on --port
        (+ on a prefill: the bootstrap app on --disaggregation-bootstrap-port, see kv/transfer.py)

Every answer is labelled simulated (`meta_info.simulated`, `/server_info.simulated`, `sglang:simulated`).
Run one by hand: `pd-orchestrator sim-server --mode prefill --port 30000` or `python -m orchestrator.engines.sim.server`.
This module is the HTTP face and the process (its flags are `settings.py`'s); the engine is `engine.py`; request
bodies are `orchestrator.api.generate` (the router validates the same model), split into prompts by `requests.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import uuid
from typing import Any

import orjson
from aiohttp import web

from orchestrator.api.generate import BadRequest, SamplingParams, parse_generate_body
from orchestrator.engines.allow_list import start_site
from orchestrator.engines.sim.engine import FAKE_BOOTSTRAP_HOST, SimEngine
from orchestrator.engines.sim.inflight import Run
from orchestrator.engines.sim.faults import FaultSpecError, RequestFate, hang_forever, parse_fault_spec
from orchestrator.engines.sim.kv.transfer import MIB
from orchestrator.engines.sim.metrics import CONTENT_TYPE
from orchestrator.engines.sim.openai.routes import SimOpenAiApi
from orchestrator.engines.sim.requests import Item, normalise
from orchestrator.engines.sim.scheduler import MAX_CATCH_UP_S
from orchestrator.engines.sim.settings import SimSettings, add_server_args, settings_from_args

log = logging.getLogger("orchestrator.engines.sim.server")

FLUSH_NOTE = "Please check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)"


def sglang_error(status: int, message: str) -> web.Response:
    """SGLang's error bodies: 400 -> {"error": {"message"}}, 5xx -> the OpenAI-style error object."""
    if status == 400:
        return web.json_response({"error": {"message": message}}, status=400)
    return web.json_response(
        {"object": "error", "message": message, "type": str(status), "param": None, "code": status}, status=status
    )


async def _wait_event(event: asyncio.Event) -> None:
    await event.wait()
    event.clear()


# ----- /server_info ---------------------------------------------------------------------------------------
def server_info(engine: SimEngine) -> dict[str, Any]:
    """SGLang's /server_info body plus the simulator's own `sim` block."""
    s = engine.settings
    p = s.spec.parallel
    stats = engine.scheduler.stats()
    args = {
        "model_path": s.model_path or s.model_preset,
        "served_model_name": s.served_model_name,
        "host": s.host, "port": s.port,
        "disaggregation_mode": s.mode,
        "disaggregation_bootstrap_port": s.bootstrap_port,
        "disaggregation_transfer_backend": s.spec.pd.transfer_backend or "mooncake",
        "tp_size": p.tp,
        "pp_size": p.pp,
        "dp_size": p.dp,
        "ep_size": p.ep,
        "enable_dp_attention": p.dp_attention,
        "nnodes": p.nnodes,
        "quantization": s.quantization,
        "max_running_requests": engine.scheduler.limits.max_running_requests,
        "chunked_prefill_size": engine.scheduler.limits.chunked_prefill_tokens,
        "mem_fraction_static": engine.cost.mem_fraction_static,
        "context_length": s.context_length or engine.arch.max_position_embeddings,
        "page_size": engine.cost.page_size,
        "kv_cache_dtype": s.spec.memory.kv_cache_dtype,
        "load_format": s.spec.load_format or "auto",
        "enable_metrics": True,
    }
    startup_time = {**engine.startup_phases, "cuda_graph": {"decode": engine.startup_phases["cuda_graph"]}}
    memory = {
        "weight": engine.cost.weights_bytes_per_gpu() / 2**30,
        "kvcache": engine.cost.kv_pool_bytes_per_gpu() / 2**30,
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
                "effective_max_running_requests_per_dp": engine.scheduler.limits.max_running_requests,
            }
        ],
        "version": f"{s.spec.sglang_version}-sim",
        "kv_events": None,
        "simulated": True,
        "sim": {
            "profile": s.profile,
            "time_scale": s.time_scale,
            "kv_transfer": engine.transfer_mode,
            "kv_bytes_per_token": engine.cost.kv_bytes_per_token(),
            "kv_payload": engine.kv_payload_stats(),
            "pacing": {"modelled_busy_s": stats.modelled_busy_s, "host_lost_s": stats.host_lost_s,
                       "max_late_s": stats.max_late_s, "max_catch_up_s": MAX_CATCH_UP_S},
            "tokenizer": engine.codec.kind if engine.codec else "loading",
            "node": s.node,
            "faults": engine.faults.describe(),
        },
    }


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
        SimOpenAiApi(self.engine).add_routes(app)
        return app

    async def generate(self, request: web.Request) -> web.StreamResponse:
        e = self.engine
        if (unavailable := e.unavailable()) is not None:
            return sglang_error(503, unavailable)
        fate = await e.faults.admit_request()
        try:
            body = parse_generate_body(await request.read())
            items = normalise(body, e.codec)
            for item in items:
                e.check_item(item)
        except BadRequest as exc:
            return sglang_error(400, str(exc))
        if fate.error:
            return sglang_error(500, "Simulated fault (error_rate): internal server error.")
        runs = [e.start_run(item, fate, body.stream) for item in items]
        if body.stream:
            return await self._stream(request, runs)
        await e.until_done(runs)
        for run in runs:
            if run.error is not None:
                return sglang_error(*run.error)
        outs = [e.response(run) for run in runs]
        return web.json_response(outs if body.is_batch else outs[0])

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
                    # orjson: a cumulative chunk re-serializes every id so far; json.dumps was 27 % of a decode's CPU
                    await resp.write(b"data: " + orjson.dumps(out) + b"\n\n")
                    sent = len(run.req.output_ids)
                if finished:
                    return
                await _wait_event(run.req.updated)

        try:
            await asyncio.gather(*(pump(run) for run in runs))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):  # the client went away: SGLang aborts the request
            self.engine.abort_unfinished(runs)
            raise
        return resp

    async def health(self, request: web.Request) -> web.Response:
        if (unavailable := self.engine.unavailable()) is not None:
            return web.Response(status=503, text=unavailable)
        if self.engine.faults.hangs_health:
            await hang_forever()
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        """A one-token generation through the scheduler (PD: the fake bootstrap host, no peer needed)."""
        e = self.engine
        if (unavailable := e.unavailable()) is not None:
            return web.Response(status=503, text=unavailable)
        if e.faults.hangs_health:
            await hang_forever()
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
        return web.json_response(server_info(self.engine))

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
                "model_type": "deepseek_v3" if self.engine.arch.is_mla else "qwen3_moe",
                "architectures": ["DeepseekV3ForCausalLM" if self.engine.arch.is_mla else "Qwen3MoeForCausalLM"],
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
    # in-flight requests (a hung one never ends) get 2 s after SIGTERM, like a server that is going away;
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its request (until_done)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0,
                           handler_cancellation=True)
    await runner.setup()
    runners.append(runner)
    await start_site(runner, host, port, backlog=2048)  # uvicorn's backlog, as SGLang; engine.allow_from enforced


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.engines.sim.server", description=__doc__)
    add_server_args(parser)
    return run_server(parser.parse_args(argv))


if __name__ == "__main__":
    # Run the importable copy of this module, not __main__: pydantic resolves the body models' annotations
    # through sys.modules[their __module__], which under runpy/cProfile is not this file.
    from orchestrator.engines.sim.server import main as _main

    raise SystemExit(_main())
