"""What a simulated server reports on /metrics: Prometheus metrics named and labelled as SGLang 0.5.17 exports them
(its /server_info body is the HTTP face's, engines/sim/server.py).

Dashboards and alerts written against a real `--enable-metrics` SGLang server read these unchanged.
Each server owns one CollectorRegistry (never the global one), and adds `sglang:simulated 1`.
Gauges are set from a scheduler snapshot when /metrics is scraped; counters and histograms are
observed as requests finish.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from orchestrator.engines.sim.scheduler import SchedulerStats

# Bucket edges from SGLang's metrics_collector defaults.
TTFT_BUCKETS_S = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS_S = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
KV_SPEED_BUCKETS_GB_S = (0.1, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 400)
KV_LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
KV_SIZE_BUCKETS_MB = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

CONTENT_TYPE = CONTENT_TYPE_LATEST

# SGLang serves multiprocess-mode metrics, which have no *_created series; match its exposition.
disable_created_metrics()


@dataclass(frozen=True)
class MetricLabels:
    """Label values SGLang attaches (scheduler metrics carry the rank labels, tokenizer ones do not)."""

    model_name: str
    engine_type: str  # prefill | decode | unified
    tp_rank: int = 0
    pp_rank: int = 0
    moe_ep_rank: int = 0

    @property
    def scheduler(self) -> dict[str, str]:
        return {
            "model_name": self.model_name,
            "engine_type": self.engine_type,
            "tp_rank": str(self.tp_rank),
            "pp_rank": str(self.pp_rank),
            "moe_ep_rank": str(self.moe_ep_rank),
        }

    @property
    def tokenizer(self) -> dict[str, str]:
        return {"model_name": self.model_name, "engine_type": self.engine_type}


@dataclass
class PdQueueSizes:
    """The PD queues the server (not the scheduler) owns."""

    prefill_bootstrap: int = 0
    prefill_inflight: int = 0
    decode_prealloc: int = 0
    decode_transfer: int = 0


class SimMetrics:
    """All `sglang:*` series of one simulated server."""

    def __init__(self, labels: MetricLabels, max_total_num_tokens: int, startup_phases_s: dict[str, float]):
        self.labels = labels
        self.registry = CollectorRegistry()
        sched = list(labels.scheduler)
        tok = list(labels.tokenizer)
        r = self.registry

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(f"sglang:{name}", doc, [*sched, *extra], registry=r)

        self.num_running_reqs = gauge("num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("num_queue_reqs", "The number of requests in the waiting queue.")
        self.gen_throughput = gauge("gen_throughput", "The generation throughput (token/s).")
        self.token_usage = gauge("token_usage", "The token usage.")
        self.num_used_tokens = gauge("num_used_tokens", "The number of used tokens.")
        self.cache_hit_rate = gauge("cache_hit_rate", "The prefix cache hit rate.")
        self.max_total_num_tokens = gauge("max_total_num_tokens", "Maximum total tokens in the KV pool.")
        self.num_prefill_bootstrap_queue_reqs = gauge(
            "num_prefill_bootstrap_queue_reqs", "Prefill requests waiting for the decode handshake."
        )
        self.num_prefill_inflight_queue_reqs = gauge(
            "num_prefill_inflight_queue_reqs", "Prefill requests whose KV is being sent."
        )
        self.num_decode_prealloc_queue_reqs = gauge(
            "num_decode_prealloc_queue_reqs", "Decode requests waiting for KV pre-allocation / handshake."
        )
        self.num_decode_transfer_queue_reqs = gauge(
            "num_decode_transfer_queue_reqs", "Decode requests whose KV is in flight."
        )
        self.kv_transfer_latency_ms = Histogram(
            "sglang:kv_transfer_latency_ms", "KV transfer latency per request (ms).", sched,
            buckets=KV_LATENCY_BUCKETS_MS, registry=r,
        )
        self.kv_transfer_speed_gb_s = Histogram(
            "sglang:kv_transfer_speed_gb_s", "KV transfer speed per request (GB/s).", sched,
            buckets=KV_SPEED_BUCKETS_GB_S, registry=r,
        )
        self.kv_transfer_total_mb = Histogram(
            "sglang:kv_transfer_total_mb", "KV transferred per request (MB).", sched,
            buckets=KV_SIZE_BUCKETS_MB, registry=r,
        )
        self.num_bootstrap_failed_reqs = Counter(
            "sglang:num_bootstrap_failed_reqs_total", "Requests failed in the PD bootstrap.", sched, registry=r
        )
        self.num_transfer_failed_reqs = Counter(
            "sglang:num_transfer_failed_reqs_total", "Requests failed in the KV transfer.", sched, registry=r
        )
        self.time_to_first_token = Histogram(
            "sglang:time_to_first_token_seconds", "Time to first token (s).", [*tok, "is_streaming"],
            buckets=TTFT_BUCKETS_S, registry=r,
        )
        self.e2e_request_latency = Histogram(
            "sglang:e2e_request_latency_seconds", "End-to-end request latency (s).", [*tok, "is_streaming"],
            buckets=E2E_BUCKETS_S, registry=r,
        )
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens_total", "Prefill tokens processed.", [*tok, "is_streaming"], registry=r
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens_total", "Generation tokens produced.", [*tok, "is_streaming"], registry=r
        )
        self.cached_tokens = Counter(
            "sglang:cached_tokens_total", "Prefix-cached prompt tokens.", [*tok, "cache_source"], registry=r
        )
        self.num_requests = Counter(
            "sglang:num_requests_total", "Requests finished.", [*tok, "is_streaming"], registry=r
        )
        self.num_aborted_requests = Counter(
            "sglang:num_aborted_requests_total", "Requests aborted.", tok, registry=r
        )
        startup = Gauge(
            "sglang:startup_time_seconds", "Start-up time per phase (s).", [*tok, "phase"], registry=r
        )
        for phase, seconds in startup_phases_s.items():
            startup.labels(**labels.tokenizer, phase=phase).set(seconds)
        Gauge("sglang:simulated", "1: this server is the simulated engine, not SGLang.", registry=r).set(1)
        self.max_total_num_tokens.labels(**labels.scheduler).set(max_total_num_tokens)
        self.cache_hit_rate.labels(**labels.scheduler).set(0.0)
        # Create every labelled child now so that a scrape before the first request shows zeros.
        for h in (self.kv_transfer_latency_ms, self.kv_transfer_speed_gb_s, self.kv_transfer_total_mb):
            h.labels(**labels.scheduler)
        for c in (self.num_bootstrap_failed_reqs, self.num_transfer_failed_reqs):
            c.labels(**labels.scheduler)
        self.num_aborted_requests.labels(**labels.tokenizer)
        for streaming in ("false", "true"):
            for m in (self.time_to_first_token, self.e2e_request_latency, self.prompt_tokens,
                      self.generation_tokens, self.num_requests):
                m.labels(**labels.tokenizer, is_streaming=streaming)

    def refresh(self, stats: SchedulerStats, queues: PdQueueSizes) -> None:
        """Set the gauges from a snapshot; called just before each scrape."""
        s = self.labels.scheduler
        self.num_running_reqs.labels(**s).set(stats.num_running_reqs)
        self.num_queue_reqs.labels(**s).set(stats.num_queue_reqs)
        self.gen_throughput.labels(**s).set(stats.gen_throughput)
        self.token_usage.labels(**s).set(stats.token_usage)
        self.num_used_tokens.labels(**s).set(stats.kv_used_tokens)
        self.num_prefill_bootstrap_queue_reqs.labels(**s).set(queues.prefill_bootstrap)
        self.num_prefill_inflight_queue_reqs.labels(**s).set(queues.prefill_inflight)
        self.num_decode_prealloc_queue_reqs.labels(**s).set(queues.decode_prealloc)
        self.num_decode_transfer_queue_reqs.labels(**s).set(queues.decode_transfer)

    def observe_finished(
        self,
        *,
        streaming: bool,
        prompt_tokens: int,
        completion_tokens: int,
        ttft_s: float | None,
        e2e_s: float,
        aborted: bool,
    ) -> None:
        t = {**self.labels.tokenizer, "is_streaming": "true" if streaming else "false"}
        if aborted:
            self.num_aborted_requests.labels(**self.labels.tokenizer).inc()
        self.num_requests.labels(**t).inc()
        self.prompt_tokens.labels(**t).inc(prompt_tokens)
        self.generation_tokens.labels(**t).inc(completion_tokens)
        if ttft_s is not None:
            self.time_to_first_token.labels(**t).observe(ttft_s)
        self.e2e_request_latency.labels(**t).observe(e2e_s)

    def finished_tally(self) -> tuple[int, int]:
        """(requests finished, of them aborted) since start: what the server's last log line reports."""
        tok = self.labels.tokenizer
        finished = sum(self.registry.get_sample_value("sglang:num_requests_total", {**tok, "is_streaming": s}) or 0
                       for s in ("false", "true"))
        aborted = self.registry.get_sample_value("sglang:num_aborted_requests_total", tok) or 0
        return int(finished), int(aborted)

    def observe_kv_transfer(self, nbytes: int, latency_s: float) -> None:
        s = self.labels.scheduler
        self.kv_transfer_latency_ms.labels(**s).observe(latency_s * 1e3)
        self.kv_transfer_total_mb.labels(**s).observe(nbytes / 1e6)
        if latency_s > 0:
            self.kv_transfer_speed_gb_s.labels(**s).observe(nbytes / 1e9 / latency_s)

    def bootstrap_failed(self) -> None:
        self.num_bootstrap_failed_reqs.labels(**self.labels.scheduler).inc()

    def transfer_failed(self) -> None:
        self.num_transfer_failed_reqs.labels(**self.labels.scheduler).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
