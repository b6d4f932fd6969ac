"""What the router reports (`MetricsSink`), and that report for requests that arrive over HTTP (/generate,
/v1/completions, /v1/chat/completions).

The batch API (`generate_batch`) counts its requests itself; these are the same series for everything
else, so a serving benchmark or an OpenAI client pointed at the router shows on the dashboards too. A
batched /generate (a list of prompts) counts one request per prompt, as SGLang does.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from orchestrator.records import CLIENT_LEFT_REASON, RequestResult
from orchestrator.router.dispatch.pairs import Pair, Progress


class MetricsSink(Protocol):
    """The router's metrics: observe.metrics.RouterMetrics (Prometheus) is ours; None where nothing is counted."""

    def add_worker(self, role: str, worker: str) -> None: ...
    def state_change(self, old: str | None, new: str | None) -> None: ...  # a request's state; None: in / out
    def worker_outstanding(self, role: str, worker: str, n: int) -> None: ...
    def completed(self, result: RequestResult) -> None: ...
    def rejected(self, reason: str) -> None: ...  # refused at the gateway before routing (503)


class IngressTracker:
    """One HTTP request's life in RouterMetrics: in flight from construction to `answered()` / `failed()`."""

    def __init__(self, metrics: MetricsSink | None, body: dict):
        self.metrics = metrics
        self.prompt_lens = [len(ids) for ids in _prompts(body)]
        self.started = time.monotonic()
        self.progress = Progress("prefill")
        if metrics is not None:
            metrics.state_change(None, "prefill")

    def answered(self, payload: Any, pair: Pair, ttft_s: float | None = None,
                 kv_wait_s: float | None = None) -> None:
        if self.metrics is None:
            return
        self._leave()
        items = payload if isinstance(payload, list) else [payload]
        for prompt_len, item in zip(self.prompt_lens, items):
            meta = (item.get("meta_info") if isinstance(item, dict) else None) or {}
            tokens = int(meta.get("completion_tokens") or 0)
            self.metrics.completed(RequestResult(
                index=-1, status="ok", prompt_len=prompt_len, output_len=tokens, completion_tokens=tokens,
                ttft_s=ttft_s, kv_wait_s=kv_wait_s, e2e_s=time.monotonic() - self.started,
                prefill_worker=pair.prefill.name if pair.prefill is not None else None,
                decode_worker=pair.decode.name))

    def failed(self, error: str) -> None:
        if self.metrics is None:
            return
        self._leave()
        for prompt_len in self.prompt_lens:
            self.metrics.completed(RequestResult(index=-1, status="failed", prompt_len=prompt_len,
                                                 output_len=0, error=error))

    def client_left(self) -> None:
        """The client went away before its answer ended (AIPerf cancels those it holds when its grace period ends)."""
        self.failed(f"{CLIENT_LEFT_REASON}: the client went away")

    def _leave(self) -> None:
        if self.metrics is not None and self.progress.state is not None:
            self.metrics.state_change(self.progress.state, None)
            self.progress.state = None


def _prompts(body: dict) -> list[list[int]]:
    ids = body.get("input_ids") or []
    return ids if ids and isinstance(ids[0], list) else [ids]
