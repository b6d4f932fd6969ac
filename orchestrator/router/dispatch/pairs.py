"""One attempt's records: the worker Pair, the decode's Answer, a request's Progress; /generate body helpers."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.api.generate import SGLANG_DEFAULT_MAX_NEW_TOKENS
from orchestrator.router.dispatch.engine_client import LegStamps
from orchestrator.router.dispatch.policies import RequestShape, WorkerState


@dataclass
class Pair:
    """Where one attempt goes: a prefill + decode, or (aggregated) only `decode` set to the worker."""

    decode: WorkerState
    prefill: WorkerState | None = None
    prefill_tokens: int = 0  # this request's token cost on each leg (WorkerState.outstanding_tokens)
    decode_tokens: int = 0


@dataclass(slots=True)
class RequestStamps:
    """Router-side times of the legs of a request's latest attempt (aggregated: its one leg is `decode`)."""

    prefill: LegStamps = field(default_factory=LegStamps)
    decode: LegStamps = field(default_factory=LegStamps)


@dataclass
class Answer:
    """The decode's answer to one attempt, plus router-side timings (seconds from send)."""

    status: int
    payload: Any  # decode JSON (non-stream) or its last SSE chunk (stream collected)
    pair: Pair
    rid: str
    attempts: int = 1
    sent_at: float = 0.0  # time.time() of the first attempt
    origin: float = field(default_factory=time.monotonic)  # time.monotonic() of the first attempt
    ttft_s: float | None = None
    kv_wait_s: float | None = None
    e2e_s: float | None = None
    output_ids: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    progress: "Progress | None" = None  # the request's state for RouterMetrics, shared by its attempts
    stamps: RequestStamps | None = None  # the caller's, written by each attempt's legs


@dataclass(eq=False)  # a handle: one per request, compared by identity
class Progress:
    """Where one benchmark request is (RouterMetrics states, mirrored into the gauge) and the attempt it is in."""

    state: str | None = "queued"
    attempt: tuple[str, Pair] | None = None  # (rid, pair) of the attempt in flight
    stopping: bool = False  # its batch was stopped: its decode leg was aborted, no further attempt
    sent: bool = False  # an attempt posted it to a pair (it stays True after a failed attempt)


def host_of(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).hostname or "127.0.0.1"


def batch_size(body: dict) -> int | None:
    """Items in a batched /generate (list of texts or of id lists), None for a single prompt."""
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list):
        return len(text)
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    return None



def request_shape(body: dict) -> RequestShape:
    """Prompt length, output budget and (first) prompt ids of a /generate engine body, for the policies."""
    ids = body.get("input_ids") or []
    prompts = ids if ids and isinstance(ids[0], list) else [ids]
    params = body.get("sampling_params") or {}
    if isinstance(params, list):  # a batched /generate may give each prompt its own sampling_params
        max_new_tokens = sum(_max_new_tokens(p) for p in params)
    else:
        max_new_tokens = _max_new_tokens(params) * len(prompts)
    return RequestShape(prompt_tokens=sum(len(p) for p in prompts), max_new_tokens=max_new_tokens,
                        prompt_ids=prompts[0])


def _max_new_tokens(params: Any) -> int:
    n = params.get("max_new_tokens") if isinstance(params, dict) else None
    return SGLANG_DEFAULT_MAX_NEW_TOKENS if n is None else int(n)


def fill_from_payload(answer: Answer, payload: Any) -> None:
    item = payload[0] if isinstance(payload, list) and payload else payload
    if not isinstance(item, dict):
        return
    meta = item.get("meta_info") or {}
    answer.completion_tokens = int(meta.get("completion_tokens") or 0)
    answer.output_ids = list(item.get("output_ids") or [])


def with_pairing(body: dict, pair: Pair, rid: str, rooms: list[int]) -> dict:
    """The body both legs get: an explicit rid and, in PD, the prefill's bootstrap address and the rooms."""
    out = dict(body)
    out["rid"] = rid
    if pair.prefill is None:
        return out
    ep = pair.prefill.endpoint
    host = ep.bootstrap_host or ep.node_ip or host_of(ep.url)
    n = batch_size(body)
    if n is None:
        out.update(bootstrap_host=host, bootstrap_port=ep.bootstrap_port, bootstrap_room=rooms[0])
    else:  # a batched /generate: one room per item, lists as SGLang normalises them
        out.update(bootstrap_host=[host] * n, bootstrap_port=[ep.bootstrap_port] * n, bootstrap_room=rooms)
        out["rid"] = [f"{rid}{i:06d}" for i in range(n)]  # fixed width: abort by prefix `rid` hits all
    return out
