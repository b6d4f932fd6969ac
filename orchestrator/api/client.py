"""Closed-loop streaming client for SGLang's `/generate`: TTFT, ITL, TPOT and e2e per request, like `bench_serving`.

`run_at_concurrency(url, requests, concurrency)` keeps exactly `concurrency` requests in flight (a
semaphore over all requests, as `sglang.bench_serving --max-concurrency` with an infinite request rate),
streams each answer and times every SSE chunk. `summarize(...)` turns the per-request timings into the
level's throughput and latency statistics with bench_serving's definitions (§5.3 of the PD notes):
output length = server `completion_tokens`, TPOT = (e2e - TTFT) / (output - 1), ITL = gap between chunks
divided by the tokens the chunk added, repeated per token.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import asdict, dataclass, field

import aiohttp
import numpy as np
from pydantic import ValidationError

from orchestrator.api.generate import BadRequest, GenerateBody, invalid_body_message
from orchestrator.api.sse import json_events
from orchestrator.config.benchmark import inter_token_latency_s
from orchestrator.records import BenchRequest


@dataclass
class StreamedRequest:
    """How one streamed request went; times in seconds, `itl_s` one entry per token after the first."""

    index: int
    prompt_len: int
    requested_output_len: int
    ok: bool = False
    completion_tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    error: str | None = None


@dataclass
class LatencyStats:
    """Mean / median / p90 / p99 of one latency, in milliseconds (None when no sample exists)."""

    mean_ms: float | None
    median_ms: float | None
    p90_ms: float | None
    p99_ms: float | None

    @classmethod
    def of(cls, seconds: list[float]) -> "LatencyStats":
        if not seconds:
            return cls(None, None, None, None)
        ms = np.asarray(seconds, dtype=float) * 1000.0
        return cls(
            float(ms.mean()), float(np.median(ms)), float(np.percentile(ms, 90)), float(np.percentile(ms, 99))
        )


@dataclass
class LevelMetrics:
    """Throughput and latency of one fixed-concurrency level, bench_serving's definitions."""

    concurrency: int
    num_prompts: int
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    output_throughput_per_gpu: float
    total_throughput_per_gpu: float
    achieved_concurrency: float  # sum(e2e) / duration, as bench_serving's "Concurrency"
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    first_error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def generate_body(req: BenchRequest, stream: bool) -> dict:
    """The `/generate` body bench_serving sends: greedy, ignore_eos, input_ids (text only if no ids), built
    with the model the router and the simulated engine validate with; BadRequest names a wrong field."""
    prompt: dict = {"input_ids": list(req.input_ids)} if req.input_ids else {"text": req.text or ""}
    try:
        body = GenerateBody.model_validate({**prompt, "stream": stream, "sampling_params": {
            "temperature": 0.0, "max_new_tokens": req.output_len, "ignore_eos": True}})
    except ValidationError as exc:
        raise BadRequest(invalid_body_message(exc.errors())) from None
    return body.model_dump(exclude_unset=True, exclude_none=True)


def auth_headers(api_key_env: str | None) -> dict[str, str]:
    """Bearer header from the router's API-key variable, when one is configured and set."""
    key = os.environ.get(api_key_env) if api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def merge_output_ids(collected: list[int], chunk_ids: list[int], completion_tokens: int) -> list[int]:
    # SGLang streams cumulative output_ids by default and deltas with --incremental-streaming-output;
    # the server's completion_tokens tells which one this chunk is.
    if len(chunk_ids) == completion_tokens:
        return list(chunk_ids)
    return collected + list(chunk_ids)


def abort_message(meta: dict) -> str | None:
    reason = meta.get("finish_reason")
    if isinstance(reason, dict) and reason.get("type") == "abort":
        return f"aborted by server: {reason.get('message') or reason}"
    return None


async def stream_one(
    session: aiohttp.ClientSession, url: str, req: BenchRequest, headers: dict[str, str] | None = None
) -> StreamedRequest:
    """POST one streaming `/generate` and time every chunk; never raises, failures land in `.error`."""
    out = StreamedRequest(index=req.index, prompt_len=req.prompt_len, requested_output_len=req.output_len)
    start = time.perf_counter()
    last_chunk_at = start
    try:
        async with session.post(url + "/generate", json=generate_body(req, True), headers=headers) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return out
            async for chunk in json_events(resp.content.iter_any()):
                if "error" in chunk:
                    out.error = f"server error: {chunk['error']}"
                    return out
                now = time.perf_counter()
                meta = chunk.get("meta_info", {})
                aborted = abort_message(meta)
                if aborted:
                    out.error = aborted
                    return out
                tokens = int(meta.get("completion_tokens", out.completion_tokens))
                new_tokens = tokens - out.completion_tokens
                if new_tokens <= 0:
                    continue
                if out.ttft_s is None:
                    out.ttft_s = now - start
                    # tokens that arrive together with the first one have no gap of their own
                else:
                    out.itl_s.extend([(now - last_chunk_at) / new_tokens] * new_tokens)
                last_chunk_at = now
                out.output_ids = merge_output_ids(out.output_ids, chunk.get("output_ids") or [], tokens)
                out.completion_tokens = tokens
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, BadRequest) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    out.e2e_s = time.perf_counter() - start
    if out.completion_tokens == 0:
        out.error = "stream ended without any generated token"
        return out
    out.ok = True
    return out


async def run_at_concurrency(
    url: str,
    requests: list[BenchRequest],
    concurrency: int,
    timeout_s: float = 3600.0,
    headers: dict[str, str] | None = None,
) -> tuple[list[StreamedRequest], float]:
    """Send every request with at most `concurrency` in flight; return results (in order) and wall seconds."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    limit = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_read=timeout_s)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def limited(req: BenchRequest) -> StreamedRequest:
            async with limit:
                return await stream_one(session, url, req, headers)

        start = time.perf_counter()
        results = await asyncio.gather(*(limited(r) for r in requests))
        duration = time.perf_counter() - start
    return list(results), duration


def summarize(results: list[StreamedRequest], duration_s: float, concurrency: int, num_gpus: int) -> LevelMetrics:
    """Aggregate one level's results; tok/s per GPU divides by the layout's GPU count."""
    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    input_tokens = sum(r.prompt_len for r in done)
    output_tokens = sum(r.completion_tokens for r in done)
    duration = max(duration_s, 1e-9)
    tpots = [
        tpot for r in done
        if r.e2e_s is not None and r.ttft_s is not None
        and (tpot := inter_token_latency_s(r.ttft_s, r.e2e_s, r.completion_tokens)) is not None
    ]
    gpus = max(num_gpus, 1)
    return LevelMetrics(
        concurrency=concurrency,
        num_prompts=len(results),
        completed=len(done),
        failed=len(failed),
        duration_s=duration_s,
        total_input_tokens=input_tokens,
        total_output_tokens=output_tokens,
        request_throughput=len(done) / duration,
        input_throughput=input_tokens / duration,
        output_throughput=output_tokens / duration,
        total_throughput=(input_tokens + output_tokens) / duration,
        output_throughput_per_gpu=output_tokens / duration / gpus,
        total_throughput_per_gpu=(input_tokens + output_tokens) / duration / gpus,
        achieved_concurrency=sum(r.e2e_s or 0.0 for r in done) / duration,
        ttft=LatencyStats.of([r.ttft_s for r in done if r.ttft_s is not None]),
        tpot=LatencyStats.of(tpots),
        itl=LatencyStats.of([gap for r in done for gap in r.itl_s]),
        e2e=LatencyStats.of([r.e2e_s for r in done if r.e2e_s is not None]),
        first_error=failed[0].error if failed else None,
    )
