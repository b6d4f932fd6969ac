"""`pd-orchestrator bench --config X`: the offline benchmark; prints SGLang's result block and the verdict.
`pd-orchestrator serve --config X`: the same deployment kept up as an OpenAI gateway until SIGTERM / Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from orchestrator.cli.args import add_config_args, config_from_args
from orchestrator.run.bench import run_bench
from orchestrator.run.serve import run_serve


def _cmd_bench(args: argparse.Namespace) -> int:
    started_at = time.time()
    cfg = config_from_args(args)
    if cfg.benchmark.closed_loop:
        print(f"bench: benchmark.kind=closed_loop in {args.config}: bench runs a prompt batch; measure a closed loop "
              "with `serve` + `goodput` (predict it with `plan`), or set benchmark.kind: batch", file=sys.stderr)
        return 2
    if args.quiet:
        logging.getLogger("ray").setLevel(logging.WARNING)
    result = run_bench(cfg, force=args.force, quiet=args.quiet, num_prompts=args.num_prompts,
                       result_dir=args.result_dir, started_at=started_at)
    first, *detail = (result.verdict.why_invalid() or "").splitlines() or [""]  # VALID: no reason
    if not result.valid:  # the whole reason first, where the eye lands after the live view
        print("\n".join([f"INVALID: {first}", *detail]) + "\n")
    print(result.text())
    print(f"result: {result.result_path}")
    if result.report_path is not None:
        print(f"report: {result.report_path}")
    if not result.valid:
        if detail:
            print("\n".join(detail))
        print(f"INVALID: {first}", flush=True)  # and last: the last line of the output (and job log)
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="offline benchmark: place workers, run the ShareGPT batch, print the result block")
    add_config_args(p)
    p.add_argument("--quiet", action="store_true", help="only the result block and the verdict")
    p.add_argument("--force", action="store_true", help="run even if the memory preflight says it does not fit")
    p.add_argument("--num-prompts", type=int, default=None, help="override benchmark.num_prompts")
    p.add_argument("--result-dir", default=None, help="override benchmark.result_dir (result.json goes below)")
    p.set_defaults(func=_cmd_bench)
    register_serve(sub)


def _cmd_serve(args: argparse.Namespace) -> int:
    return run_serve(config_from_args(args), drain_s=args.drain_s, say=lambda line: print(line, flush=True))


def register_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve: place workers and the router as bench does, warm every PD pair, keep "
                                     "the OpenAI gateway up until SIGTERM/Ctrl-C, then drain and tear down")
    add_config_args(p)
    p.add_argument("--drain-s", type=float, default=30.0,
                   help="on SIGTERM/Ctrl-C, wait up to this long for in-flight requests before tearing down")
    p.set_defaults(func=_cmd_serve)
