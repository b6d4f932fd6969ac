"""`pd-orchestrator mlperf`: MLPerf LoadGen (Offline/Server) against the router of a deployment or --url."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from orchestrator.api.client import auth_headers
from orchestrator.cli.args import add_config_args, optional_config_from_args
from orchestrator.run.mlperf import MlperfError, MlperfSettings, default_samples, load_samples, run_loadgen


def _cmd_mlperf(args: argparse.Namespace) -> int:
    from orchestrator.run.deployment import deployment_url

    if not args.config and not args.url:
        print("mlperf: give --config (bring up its deployment) or --url (an already running router)", file=sys.stderr)
        return 2
    from orchestrator.workload.dataset import DatasetError

    cfg = optional_config_from_args(args)
    try:
        if args.dataset:
            samples = load_samples(args.dataset, max_output_tokens=args.max_output_tokens, limit=args.num_samples)
        else:
            samples = default_samples(cfg, args.num_samples or (cfg.benchmark.num_prompts if cfg else 1000))
    except (MlperfError, DatasetError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    settings = MlperfSettings(
        scenario=args.scenario, mode="AccuracyOnly" if args.accuracy_log else "PerformanceOnly",
        offline_expected_qps=args.expected_qps, server_target_qps=args.target_qps,
        server_ttft_latency_ms=args.ttft_latency_ms, server_tpot_latency_ms=args.tpot_latency_ms,
        min_duration_ms=int(args.min_duration_s * 1000), min_query_count=args.min_query_count or len(samples),
        max_query_count=args.max_query_count, user_conf=args.user_conf,
    )
    name = cfg.name if cfg else "url"
    out_dir = Path(args.out or Path(cfg.benchmark.result_dir if cfg else "runs")
                   / f"mlperf-{name}-{args.scenario.lower()}-{time.strftime('%Y%m%d-%H%M%S')}")
    simulated = bool(cfg and cfg.engine.kind == "sim")
    try:
        if cfg is None:
            from contextlib import nullcontext

            context = nullcontext(args.url.rstrip("/"))
        else:
            context = deployment_url(cfg, args.url)
        with context as url:
            report = run_loadgen(url, samples, settings, out_dir, args.max_in_flight, args.request_timeout_s,
                                 auth_headers(cfg.router.api_key_env if cfg else None), simulated)
    except MlperfError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    summary = report["loadgen_summary"]
    label = " (SIMULATED engine)" if simulated else ""
    counts = f"{report['sut']['completed']} ok / {report['sut']['failed']} failed"
    if settings.mode == "AccuracyOnly":  # LoadGen writes no performance result in this mode
        print(f"LoadGen {settings.scenario} AccuracyOnly{label}: output tokens of every sample in "
              f"{out_dir / 'mlperf_log_accuracy.json'}; {counts}")
    else:
        tokens_s = summary.get("Tokens per second", summary.get("Completed tokens per second", "?"))
        print(f"LoadGen {settings.scenario}{label}: {summary.get('Result is', '?')}; tokens/s {tokens_s}; {counts}")
    print(f"logs: {out_dir}")
    return 0 if report["sut"]["failed"] == 0 else 1


def register(sub: argparse._SubParsersAction) -> None:
    """`pd-orchestrator mlperf`."""
    p = sub.add_parser("mlperf", help="MLPerf LoadGen (Offline/Server) against the router")
    add_config_args(p, required=False, help="run config; without --url its deployment is brought up")
    p.add_argument("--url", help="router base URL")
    p.add_argument("--scenario", choices=["Offline", "Server"], default="Offline")
    p.add_argument("--dataset", help="pickle/JSON of prompts (MLPerf DeepSeek-R1 format, or [{input_ids|text}])")
    p.add_argument("--num-samples", type=int, help="samples in the QSL (default benchmark.num_prompts / whole file)")
    p.add_argument("--max-output-tokens", type=int, default=1024, help="output length when the file has none")
    p.add_argument("--expected-qps", type=float, default=1.0, help="Offline: offline_expected_qps")
    p.add_argument("--target-qps", type=float, default=1.0, help="Server: server_target_qps")
    p.add_argument("--ttft-latency-ms", type=float, default=2000.0, help="Server: TTFT constraint")
    p.add_argument("--tpot-latency-ms", type=float, default=80.0, help="Server: TPOT constraint")
    p.add_argument("--min-duration-s", type=float, default=60.0, help="LoadGen min_duration")
    p.add_argument("--min-query-count", type=int, default=0, help="LoadGen min_query_count (default: all samples)")
    p.add_argument("--max-query-count", type=int, default=0, help="LoadGen max_query_count (0 = none)")
    p.add_argument("--user-conf", help="MLPerf user.conf; its values win over these flags")
    p.add_argument("--accuracy-log", action="store_true", help="AccuracyOnly mode: every sample once, tokens logged")
    p.add_argument("--max-in-flight", type=int, default=256, help="client-side cap on concurrent requests")
    p.add_argument("--request-timeout-s", type=float, default=3600.0)
    p.add_argument("--out", help="output directory for LoadGen's logs and mlperf_run.json")
    p.set_defaults(func=_cmd_mlperf)
