"""`pd-orchestrator report runs/<id>/result.json [--out DIR]`: plots + one self-contained report.html of a run."""

from __future__ import annotations

import argparse

from orchestrator.observe.html_report import write_report


def _cmd_report(args: argparse.Namespace) -> int:
    print(write_report(args.result, args.out))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write report.html (plots of throughput, latency, worker load, phases) for a run")
    p.add_argument("result", help="runs/<id>/result.json")
    p.add_argument("--out", help="output folder (default: beside result.json)")
    p.set_defaults(func=_cmd_report)
