"""`pd-orchestrator sweep`: accuracy gate, then fixed-concurrency levels per ISL/OSL pair against the router."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from orchestrator.cli.accuracy import add_gate_args, spec_from_args
from orchestrator.cli.args import add_config_args, config_from_args
from orchestrator.config import RunConfig
from orchestrator.run.deployment import deployment_url
from orchestrator.run.sweep import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PAIRS,
    PROMPTS_PER_CONCURRENCY,
    SweepError,
    SweepPlan,
    parse_concurrencies,
    parse_pairs,
    run_sweep,
)


def plan_from_args(args: argparse.Namespace, cfg: RunConfig) -> SweepPlan:
    if not 0.0 <= args.range_ratio <= 1.0:
        raise SweepError(f"--range-ratio must be within [0, 1], got {args.range_ratio}")
    return SweepPlan(
        pairs=parse_pairs(args.isl_osl),
        concurrencies=parse_concurrencies(args.concurrency),
        range_ratio=args.range_ratio,
        num_prompts_per_level=args.num_prompts_per_level,
        warmup=args.warmup,
        seed=args.seed if args.seed is not None else cfg.benchmark.seed,
        dataset_path=args.dataset_path or cfg.benchmark.dataset_path,
        request_timeout_s=args.request_timeout_s,
    )


def _cmd_sweep(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    try:
        plan = plan_from_args(args, cfg)
    except SweepError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    from orchestrator.workload.dataset import DatasetError

    out_dir = Path(args.out or Path(cfg.benchmark.result_dir) / f"sweep-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        with deployment_url(cfg, args.url) as url:
            report = run_sweep(cfg, url, plan, spec_from_args(args), out_dir)
    except (SweepError, DatasetError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(f"results: {out_dir / 'sweep.json'}")
    if report["aborted"]:
        print(f"sweep aborted: {report['aborted']}", file=sys.stderr)
        return 1
    failed = sum(level["failed"] for pair in report["pairs"] for level in pair["levels"])
    if failed:
        print(f"{failed} requests failed; see first_error per level in sweep.json", file=sys.stderr)
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="concurrency sweep over ISL/OSL pairs, behind an accuracy gate")
    add_config_args(p)
    p.add_argument("--url", help="router base URL; default: bring up the deployment from --config")
    p.add_argument("--isl-osl", default=DEFAULT_PAIRS, help=f"ISL/OSL pairs (default {DEFAULT_PAIRS})")
    p.add_argument("--concurrency", default=DEFAULT_CONCURRENCY, help=f"levels (default {DEFAULT_CONCURRENCY})")
    p.add_argument("--range-ratio", type=float, default=1.0, help="length range ratio as SGLang's random dataset")
    p.add_argument("--num-prompts-per-level", type=int, default=None,
                   help=f"prompts per level (default {PROMPTS_PER_CONCURRENCY} x concurrency)")
    p.add_argument("--warmup", type=int, default=8, help="warm-up requests per ISL/OSL pair (0 = none)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default benchmark.seed)")
    p.add_argument("--dataset-path", help="ShareGPT JSON the prompts are cut from (default benchmark.dataset_path)")
    p.add_argument("--request-timeout-s", type=float, default=3600.0)
    p.add_argument("--out", help="output directory (default <benchmark.result_dir>/sweep-<name>-<time>)")
    add_gate_args(p)
    p.set_defaults(func=_cmd_sweep)
