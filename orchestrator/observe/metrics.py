"""Prometheus metrics of the router (per request) and the bench driver (phase, deadline, progress).

Every process that records metrics owns a `CollectorRegistry` and serves it with its own exporter
(`start_exporter`); the orchestrator lists those exporters, plus every engine's `/metrics`, in a
Prometheus file_sd JSON (`orchestrator/observe/file_sd.py`). Names share the `pdorch_` prefix and carry their
unit; every series has the labels `run_id` and `layout`, so one Prometheus can hold many runs.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from orchestrator.config.benchmark import SloConfig, inter_token_latency_s
from orchestrator.phases import BEFORE_PLACEMENT, Phase
from orchestrator.records import CLIENT_LEFT_REASON, RequestResult

log = logging.getLogger(__name__)

PREFIX = "pdorch_"
REQUEST_STATES = ("queued", "prefill", "transferring", "decoding")
BENCH_PHASES = tuple(p.value for p in Phase if p not in BEFORE_PLACEMENT)
EXTRA_PHASES = tuple(p.value for p in BEFORE_PLACEMENT)  # the driver's phases before placement


def canonical_phase(name: str) -> str:
    """The phase label for `name` (the driver's spellings accepted); ValueError names the allowed ones."""
    return Phase.of(name).value

# Buckets span a loopback sim run (milliseconds) up to a request that waits out a 420 s deadline.
LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 240, 420, 600,
)


# The router's failure reasons (first word of its DispatchError messages, orchestrator/router/dispatch/failures.py);
# each starts at 0, so a dashboard's failures-by-reason panel shows 0 for a run without failures, not nothing.
# http_<status> and other words still get their own series when they happen.
KNOWN_FAILURE_REASONS = ("timeout", "connect", "aborted", "error", "empty", "bad_json", "no_worker", "deadline",
                         "stream_cut")
# The gateway's refusals (orchestrator/router/core.py), each started at 0 like the failure reasons.
KNOWN_REJECT_REASONS = ("queue_full", "stopping")

# ITL buckets resolve the 20 ms line (the latency buckets jump from 10 to 25 ms).
ITL_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class RouterMetrics:
    """Request-level metrics recorded by a router replica: states, outcomes, tokens, latencies."""

    def __init__(self, run_id: str, layout: str, registry: CollectorRegistry | None = None, slo: SloConfig | None = None):
        # the SLO the good-request counters judge by: the run config's benchmark.slo, the one `goodput` judges by
        # (its defaults are the 2026 contest's, AIPerf `--goodput "time_to_first_token:3000 inter_token_latency:20"`)
        self.slo = slo if slo is not None else SloConfig()
        self.registry = registry if registry is not None else CollectorRegistry()
        self._base = {"run_id": run_id, "layout": layout}
        base = list(self._base)
        reg = self.registry
        self.requests_in_flight = Gauge(
            PREFIX + "requests_in_flight", "Requests currently in each state.", base + ["state"], registry=reg
        )
        self.requests_completed = Counter(
            PREFIX + "requests_completed", "Requests answered successfully.", base, registry=reg
        )
        self.requests_failed = Counter(
            PREFIX + "requests_failed", "Requests that ended in an error, by reason.", base + ["reason"],
            registry=reg,
        )
        self.requests_rejected = Counter(
            PREFIX + "requests_rejected", "Requests the gateway refused before routing them (503), by reason.",
            base + ["reason"], registry=reg,
        )
        # Input tokens are counted on the worker that prefilled them, output tokens on the one that
        # decoded them, so rate() of each is that phase's throughput, per worker or summed.
        self.input_tokens = Counter(
            PREFIX + "input_tokens", "Prompt tokens of completed requests.", base + ["role", "worker"],
            registry=reg,
        )
        self.output_tokens = Counter(
            PREFIX + "output_tokens", "Generated tokens of completed requests.", base + ["role", "worker"],
            registry=reg,
        )
        self.ttft_seconds = Histogram(
            PREFIX + "ttft_seconds", "Time to first token, router-side.", base, buckets=LATENCY_BUCKETS_S,
            registry=reg,
        )
        self.e2e_seconds = Histogram(
            PREFIX + "e2e_seconds", "End-to-end request latency, router-side.", base,
            buckets=LATENCY_BUCKETS_S, registry=reg,
        )
        self.itl_seconds = Histogram(
            PREFIX + "itl_seconds", "Inter-token latency of each streamed request: (e2e - TTFT) / (output tokens - 1).",
            base, buckets=ITL_BUCKETS_S, registry=reg,
        )
        # AIPerf's goodput, counted at the gateway (config/benchmark.good_request_fraction): judged = completed
        # requests (AIPerf's request_count), good = those self.slo admits, attempted = judged + the errors AIPerf
        # counts (its good_request_fraction's denominator); rate() of good output tokens is the contest's score.
        self.sla_judged_requests = Counter(
            PREFIX + "sla_judged_requests", "Completed requests judged against the SLA (AIPerf's request_count); "
            "one without a TTFT (not streamed) or an ITL (one token) is judged and never good, as AIPerf counts it.",
            base, registry=reg,
        )
        self.sla_attempted_requests = Counter(
            PREFIX + "sla_attempted_requests", "Judged requests plus those failed or rejected (503) at the gateway, "
            "all but those whose client left: AIPerf's request_count + error_request_count, the denominator of its "
            "good_request_fraction.", base, registry=reg,
        )
        self.sla_good_requests = Counter(
            PREFIX + "sla_good_requests", f"Judged requests with TTFT <= {self.slo.ttft_ms:g} ms and ITL <= "
            f"{self.slo.itl_ms:g} ms (the run config's benchmark.slo).", base, registry=reg,
        )
        self.sla_good_output_tokens = Counter(
            PREFIX + "sla_good_output_tokens", "Generated tokens of the good requests.", base, registry=reg,
        )
        self.kv_wait_seconds = Histogram(
            PREFIX + "kv_wait_seconds", "Send until the prefill leg answered (prefill + KV transfer).", base,
            buckets=LATENCY_BUCKETS_S, registry=reg,
        )
        self.worker_outstanding_requests = Gauge(
            PREFIX + "worker_outstanding_requests", "Requests the router has outstanding at each worker.",
            base + ["role", "worker"], registry=reg,
        )
        self._lock = threading.Lock()
        self._series: dict[tuple, object] = {}
        for state in REQUEST_STATES:  # so every state has a series (0) before its first request
            self._child(self.requests_in_flight, state).set(0)
        self._child(self.requests_completed)
        for reason in KNOWN_FAILURE_REASONS:
            self._child(self.requests_failed, reason)
        for reason in KNOWN_REJECT_REASONS:
            self._child(self.requests_rejected, reason)
        for counter in (self.sla_judged_requests, self.sla_attempted_requests, self.sla_good_requests,
                        self.sla_good_output_tokens):
            self._child(counter)

    def _child(self, metric, *values: str):
        """`metric`'s series for this run's labels plus `values`, looked up once: prometheus_client's
        labels() validates, takes a lock and builds its key on every call (a fifth of the dispatcher's time)."""
        key = (id(metric), values)
        child = self._series.get(key)
        if child is None:
            child = self._series[key] = metric.labels(*self._base.values(), *values)
        return child

    def add_worker(self, role: str, worker: str) -> None:
        """Start a worker's series at 0, so rate() and increase() count its first tokens too."""
        if role in ("prefill", "aggregated"):
            self._child(self.input_tokens, role, worker)
        if role in ("decode", "aggregated"):
            self._child(self.output_tokens, role, worker)
        self._child(self.worker_outstanding_requests, role, worker).set(0)

    def state_change(self, old: str | None, new: str | None) -> None:
        """A request moved from state `old` to `new`; None means it arrived / left the router."""
        for state in (old, new):
            if state is not None and state not in REQUEST_STATES:
                raise ValueError(f"unknown request state {state!r}; allowed: {REQUEST_STATES}")
        with self._lock:
            if old is not None:
                self._child(self.requests_in_flight, old).dec()
            if new is not None:
                self._child(self.requests_in_flight, new).inc()

    def worker_outstanding(self, role: str, worker: str, n: int) -> None:
        """The router now has `n` requests outstanding at `worker`."""
        self._child(self.worker_outstanding_requests, role, worker).set(n)

    def completed(self, result: RequestResult) -> None:
        """Count a finished request: its tokens, latencies, and success or failure."""
        if result.status != "ok":
            self.failed(_reason_of(result.error))
            return
        self._child(self.requests_completed).inc()
        prefill_role, prefill_worker = (
            ("prefill", result.prefill_worker) if result.prefill_worker else ("aggregated", result.decode_worker)
        )
        decode_role = "decode" if result.prefill_worker else "aggregated"
        self._child(self.input_tokens, prefill_role, prefill_worker or "unknown").inc(result.prompt_len)
        self._child(self.output_tokens, decode_role, result.decode_worker or "unknown").inc(result.completion_tokens)
        for histogram, value in (
            (self.ttft_seconds, result.ttft_s),
            (self.e2e_seconds, result.e2e_s),
            (self.kv_wait_seconds, result.kv_wait_s),
        ):
            if value is not None:
                self._child(histogram).observe(value)
        self._judge_sla(result)

    def _judge_sla(self, result: RequestResult) -> None:
        """ITL and the SLA counters of a completed request, by SloConfig.admits as AIPerf judges it: every completed
        request is judged; one without a TTFT (not streamed) or an ITL (one token) is never good."""
        itl_s = None
        if result.ttft_s is not None and result.e2e_s is not None:
            itl_s = inter_token_latency_s(result.ttft_s, result.e2e_s, result.completion_tokens)
        if itl_s is not None:
            self._child(self.itl_seconds).observe(itl_s)
        self._child(self.sla_judged_requests).inc()
        self._child(self.sla_attempted_requests).inc()
        if self.slo.admits(result.ttft_s, itl_s):
            self._child(self.sla_good_requests).inc()
            self._child(self.sla_good_output_tokens).inc(result.completion_tokens)

    def rejected(self, reason: str) -> None:
        """Count a request refused at the gateway (e.g. `queue_full`: router.max_in_flight_requests reached)."""
        self._child(self.requests_rejected, reason).inc()
        self._child(self.sla_attempted_requests).inc()  # the client gets a 503: an error record in AIPerf

    def failed(self, reason: str) -> None:
        """Count a failed request; `reason` is a short, low-cardinality word (timeout, http_502, ...). Every failure
        but CLIENT_LEFT_REASON is an error AIPerf counts."""
        self._child(self.requests_failed, reason).inc()
        if reason != CLIENT_LEFT_REASON:
            self._child(self.sla_attempted_requests).inc()


def _reason_of(error: str | None) -> str:
    """A bounded label value from a free-text error: its first word, e.g. 'timeout' from 'timeout: ...'."""
    if not error:
        return "unknown"
    head = error.strip().split(":", 1)[0].split()[0] if error.strip() else "unknown"
    return head[:40].lower()


@dataclass
class PhaseSpan:
    """One phase of the benchmark job, in seconds since the job started."""

    name: str
    start_s: float
    end_s: float | None = None


class BenchMetrics:
    """Job-level metrics of the bench driver: current phase, deadline, elapsed, progress, projection."""

    def __init__(
        self,
        run_id: str,
        layout: str,
        deadline_s: float,
        registry: CollectorRegistry | None = None,
        started_at: float | None = None,
        time_scale: float = 1.0,
    ):
        self.registry = registry if registry is not None else CollectorRegistry()
        self.started_at = started_at if started_at is not None else time.time()
        # sim runs with engine.sim.time_scale != 1 count the deadline in simulated seconds (wall / scale)
        self.time_scale = time_scale
        self.deadline_s = deadline_s
        self._base = {"run_id": run_id, "layout": layout}
        base = list(self._base)
        reg = self.registry
        self.deadline_seconds = Gauge(
            PREFIX + "deadline_seconds", "Wall budget of the job, all phases included.", base, registry=reg
        )
        self.elapsed_seconds = Gauge(
            PREFIX + "elapsed_seconds", "Seconds since the job started (live at every scrape).", base,
            registry=reg,
        )
        self.phase_gauge = Gauge(
            PREFIX + "phase", "1 for the phase the job is in, 0 for the others.", base + ["phase"], registry=reg
        )
        self.projected_finish_seconds = Gauge(
            PREFIX + "projected_finish_seconds",
            "Elapsed + remaining output tokens at the current decode rate; compare with the deadline.",
            base, registry=reg,
        )
        self.done_prompts = Gauge(PREFIX + "bench_done_prompts", "Prompts finished (ok or failed).", base, registry=reg)
        self.planned_prompts = Gauge(PREFIX + "bench_planned_prompts", "Prompts in the batch.", base, registry=reg)
        self.done_output_tokens = Gauge(
            PREFIX + "bench_done_output_tokens", "Output tokens received so far.", base, registry=reg
        )
        self.planned_output_tokens = Gauge(
            PREFIX + "bench_planned_output_tokens", "Output tokens the batch asks for.", base, registry=reg
        )
        self.deadline_seconds.labels(**self._base).set(deadline_s)
        self.elapsed_seconds.labels(**self._base).set_function(self.elapsed_s)
        for name in (*EXTRA_PHASES, *BENCH_PHASES):
            self.phase_gauge.labels(**self._base, phase=name).set(0)
        self.timeline: list[PhaseSpan] = []

    def elapsed_s(self) -> float:
        """Seconds since the job started, in the run's unit (simulated seconds when time_scale != 1)."""
        return (time.time() - self.started_at) / self.time_scale

    def phase(self, name: str) -> None:
        """Enter phase `name` (BENCH_PHASES, EXTRA_PHASES or the driver's spelling); closes the previous one."""
        name = canonical_phase(name)
        now = self.elapsed_s()
        if self.timeline and self.timeline[-1].end_s is None:
            self.timeline[-1].end_s = now
        self.timeline.append(PhaseSpan(name, now, now if name == "done" else None))
        for other in (*EXTRA_PHASES, *BENCH_PHASES):
            self.phase_gauge.labels(**self._base, phase=other).set(1 if other == name else 0)

    def progress(
        self,
        done_prompts: int,
        total_prompts: int,
        done_output_tokens: int,
        total_output_tokens: int,
        projected_finish_s: float | None = None,
    ) -> float | None:
        """Record progress; returns the projected finish (computed from the run phase's rate if not given)."""
        self.done_prompts.labels(**self._base).set(done_prompts)
        self.planned_prompts.labels(**self._base).set(total_prompts)
        self.done_output_tokens.labels(**self._base).set(done_output_tokens)
        self.planned_output_tokens.labels(**self._base).set(total_output_tokens)
        if projected_finish_s is None:
            run_start = next((p.start_s for p in self.timeline if p.name == Phase.RUN.value), None)
            projected_finish_s = projected_finish(
                self.elapsed_s(), run_start, done_output_tokens, total_output_tokens
            )
        if projected_finish_s is not None:
            self.projected_finish_seconds.labels(**self._base).set(projected_finish_s)
        return projected_finish_s

    def timeline_dicts(self) -> list[dict]:
        """The phase timeline as JSON-ready dicts, for the result file and the HTML report."""
        return [{"name": p.name, "start_s": p.start_s, "end_s": p.end_s} for p in self.timeline]


def projected_finish(
    elapsed_s: float, run_start_s: float | None, done_tokens: int, total_tokens: int
) -> float | None:
    """elapsed + remaining tokens at the average rate since the run phase began; None before any token."""
    if run_start_s is None or done_tokens <= 0:
        return None
    if done_tokens >= total_tokens:
        return elapsed_s
    rate = done_tokens / max(elapsed_s - run_start_s, 1e-9)
    return elapsed_s + (total_tokens - done_tokens) / rate


@dataclass
class Exporter:
    """A running prometheus_client HTTP exporter; `address` is what Prometheus should scrape."""

    host: str
    port: int
    _server: WSGIServer = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_exporter(host: str, port: int, registry: CollectorRegistry) -> Exporter:
    """Serve `registry` on http://host:port/metrics; port 0, or a port already taken, gets a free port.

    Several processes of one run (driver, router replicas) share a node and the configured port, so
    a taken port is not an error: the file_sd lists the port actually bound.
    """
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or port == 0:
            raise
        log.info("metrics port %s:%d is taken; exporting on a free port instead", host, port)
        server, thread = start_http_server(0, addr=host, registry=registry)
    return Exporter(host=host, port=server.server_port, _server=server, _thread=thread)
