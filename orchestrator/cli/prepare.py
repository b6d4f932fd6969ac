"""`pd-orchestrator prepare --config X`: checks, dataset + tokenizer on every node, compile caches — before the timed run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from orchestrator.cli.args import add_config_args, config_from_args
from orchestrator.run.prepare import run_prepare


def _cmd_prepare(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    report = run_prepare(cfg, compile_caches=not args.no_compile)
    print(report.text())
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1))
        print(f"report: {args.json}", file=sys.stderr)
    return 0 if report.ok else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare",
        help="before the timed run: download-free checks, dataset + tokenizer on every node, "
        "SGLang compile caches for the run's exact shapes (sim: nothing to compile)",
    )
    add_config_args(p)
    p.add_argument("--no-compile", action="store_true", help="skip starting the engines (checks and nodes only)")
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    p.set_defaults(func=_cmd_prepare)
