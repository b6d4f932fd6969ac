"""`pd-orchestrator report --result runs/<id>/result.json [--out DIR]`: an existing run's printed result
(SGLang's block, then ours with the TTFT/TPOT/KV-wait percentiles) and its report.html with plots.

The result may sit in a raw archive: `--result ARCHIVE.tar.xz:path/in/archive/result.json` (then the
report goes to --out, default report-<run id>/ here).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.observe.html_report import write_report
from orchestrator.observe.report import read_result, render_result


def _cmd_report(args: argparse.Namespace) -> int:
    spec = args.result_opt or args.result
    if not spec:
        print("report: pass --result runs/<run id>/result.json (or ARCHIVE.tar.xz:member/result.json)", file=sys.stderr)
        return 2
    try:
        document = read_result(spec, bench=False)  # the HTML report also reads other runs' record lists
    except ValueError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    if isinstance(document.get("summary"), dict) and isinstance(document.get("results"), list):
        print(render_result(document))
    elif args.no_html:
        print(f"report: {spec} is not a bench result (no 'summary'/'results'); drop --no-html for its plots",
              file=sys.stderr)
        return 2
    if not args.no_html:
        from_file = Path(spec).is_file()
        out = args.out or (None if from_file else f"report-{document.get('run_id', 'run')}")
        print(write_report(spec if from_file else None, out, document=document))  # the last line: report.html
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="print an existing run's result (with latency percentiles) and write its report.html")
    p.add_argument("result", nargs="?", help="runs/<id>/result.json (same as --result)")
    p.add_argument("--result", dest="result_opt", metavar="RESULT",
                   help="runs/<id>/result.json, or ARCHIVE.tar.xz:member/result.json")
    p.add_argument("--out", help="folder for report.html and the plots (default: beside result.json)")
    p.add_argument("--no-html", action="store_true", help="only print the result")
    p.set_defaults(func=_cmd_report)
