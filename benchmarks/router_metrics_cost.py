"""CPU the router replica spends on its Prometheus metrics per request, with no engine or network in the way.

    .venv/bin/python benchmarks/router_metrics_cost.py --requests 50000 --rounds 5

One request's worth of `RouterMetrics` calls, as the dispatcher makes them: four state changes
(queued -> prefill -> decoding -> gone), one outstanding-count update and one completion (two token
counters, three histograms). Prints microseconds per request for each round and their median; compare
commits by running it in a checkout of each.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from orchestrator.observe.metrics import RouterMetrics
from orchestrator.records import RequestResult
from orchestrator.provenance import recorded


def one_round(requests: int) -> float:
    metrics = RouterMetrics("bench-run", "1PxTP1/1DxTP1")
    metrics.add_worker("prefill", "prefill-0")
    metrics.add_worker("decode", "decode-0")
    result = RequestResult(index=0, prompt_len=200, output_len=64, status="ok", completion_tokens=64, ttft_s=0.1,
                           e2e_s=0.9, kv_wait_s=0.05, prefill_worker="prefill-0", decode_worker="decode-0")
    started = time.perf_counter()
    for _ in range(requests):
        metrics.state_change(None, "queued")
        metrics.state_change("queued", "prefill")
        metrics.state_change("prefill", "decoding")
        metrics.worker_outstanding("decode", "decode-0", 3)
        metrics.state_change("decoding", None)
        metrics.completed(result)
    return (time.perf_counter() - started) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="results folder: manifest.json + stdout in output.txt")
    args = parser.parse_args()
    with recorded(args.out):
        rounds = [one_round(args.requests) for _ in range(args.rounds)]
        print("rounds (us/request): " + " ".join(f"{r:.1f}" for r in rounds))
        print(f"median: {statistics.median(rounds):.1f} us of RouterMetrics per request")


if __name__ == "__main__":
    main()
