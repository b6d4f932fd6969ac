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


def summarise(text: str) -> dict:
    sums: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name.split(":", 1)[-1]
            sums[name] = sums.get(name, 0.0) + s.value
    out: dict[str, float | None] = {}
    for h in HISTOGRAMS:
        count = sums.get(h + "_count", 0.0)
        out[h + "_count"] = count
        out[h + "_mean"] = sums.get(h + "_sum", 0.0) / count if count else None
    out["kv_transfer_total_mb_sum"] = sums.get("kv_transfer_total_mb_sum")
    for c in COUNTERS:
        out[c] = sums.get(c + "_total", sums.get(c))
    return out


if __name__ == "__main__":
    res = {}
    for path in sys.argv[1:]:
        res[Path(path).name] = summarise(Path(path).read_text())
    print(json.dumps(res, indent=1))
