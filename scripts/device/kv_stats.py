"""Summarise SGLang's `sglang:kv_transfer_*` histograms and PD failure counters from a /metrics scrape.
Usage: python kv_stats.py PREFILL_METRICS.prom [DECODE_METRICS.prom] -> one JSON object on stdout
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

HISTOGRAMS = ("kv_transfer_speed_gb_s", "kv_transfer_latency_ms", "kv_transfer_total_mb",
              "kv_transfer_bootstrap_ms", "kv_transfer_alloc_ms")
COUNTERS = ("num_bootstrap_failed_reqs", "num_transfer_failed_reqs", "num_prefill_retries")


def bucket_quantile(buckets: dict[float, float], q: float) -> float | None:
    """Prometheus-style estimate: linear inside the bucket the q-th observation falls in (cumulative counts)."""
    bounds = sorted(buckets)
    total = buckets.get(float("inf"), 0.0)
    if not total:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for upper in bounds:
        if buckets[upper] >= rank:
            if upper == float("inf"):
                return lower
            inside = buckets[upper] - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = upper, buckets[upper]
    return lower


def summarise(text: str) -> dict:
    sums: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name.split(":", 1)[-1]
            sums[name] = sums.get(name, 0.0) + s.value
            if name.endswith("_bucket"):
                per = buckets.setdefault(name[: -len("_bucket")], {})
                le = float(s.labels["le"])
                per[le] = per.get(le, 0.0) + s.value
    out: dict[str, float | None] = {}
    for h in HISTOGRAMS:
        count = sums.get(h + "_count", 0.0)
        out[h + "_count"] = count
        out[h + "_mean"] = sums.get(h + "_sum", 0.0) / count if count else None
        for q in (0.5, 0.9, 0.99):   # from the histogram's buckets (coarse: SGLang's bucket bounds)
            out[f"{h}_p{round(q * 100)}"] = bucket_quantile(buckets.get(h, {}), q)
    out["kv_transfer_total_mb_sum"] = sums.get("kv_transfer_total_mb_sum")
    for c in COUNTERS:
        out[c] = sums.get(c + "_total", sums.get(c))
    return out


if __name__ == "__main__":
    res = {}
    for path in sys.argv[1:]:
        res[Path(path).name] = summarise(Path(path).read_text())
    print(json.dumps(res, indent=1))
