"""`pd-orchestrator report | scaling`: an existing run's result and report.html; throughput against GPU count.

`report --result runs/<id>/result.json [--out DIR]` prints SGLang's block then ours (TTFT/TPOT/KV-wait
percentiles) and writes report.html; the result may sit in a raw archive (`ARCHIVE.tar.xz:path/result.json`,
report then goes to --out, default report-<run id>/). `scaling`: measured rows from real runs' result.json,
simulated rows for each --configs layout and the same layout on --nodes other node counts; each row says which.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.observe.html_report import write_report
from orchestrator.observe.stored import read_result, render_result


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


def _register_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="print an existing run's result (with latency percentiles) and write its report.html")
    p.add_argument("result", nargs="?", help="runs/<id>/result.json (same as --result)")
    p.add_argument("--result", dest="result_opt", metavar="RESULT",
                   help="runs/<id>/result.json, or ARCHIVE.tar.xz:member/result.json")
    p.add_argument("--out", help="folder for report.html and the plots (default: beside result.json)")
    p.add_argument("--no-html", action="store_true", help="only print the result")
    p.set_defaults(func=_cmd_report)


REPO = Path(__file__).resolve().parents[2]


def _cmd_scaling(args: argparse.Namespace) -> int:
    from orchestrator.observe.scaling import measured_rows, simulated_rows, table, write

    configs = args.configs if args.configs is not None else sorted((REPO / "configs").glob("*.yaml"))
    rows = measured_rows(args.results) + simulated_rows(configs, args.nodes, synthetic=args.synthetic)
    print(table(rows))
    for kind, path in write(rows, Path(args.out)).items():
        print(f"{kind}: {path}")
    return 0


def _register_scaling(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scaling", help="throughput vs GPU count and layout: measured runs + simulated layouts, table and plot")
    p.add_argument("--results", nargs="*", default=[str(REPO / "benchmarks" / "results")],
                   help="folders (or files) searched for real runs' result.json, also inside .tar.xz archives")
    p.add_argument("--configs", nargs="*", default=None, help="configs to simulate (default: every configs/*.yaml)")
    p.add_argument("--nodes", nargs="*", type=int, default=[1, 2, 4],
                   help="node counts each layout is scaled to (server counts scale with the nodes)")
    p.add_argument("--synthetic", action="store_true", help="ShareGPT-shaped synthetic batch instead of ShareGPT")
    p.add_argument("--out", default="runs/scaling", help="folder for scaling.png, scaling.md, scaling.json")
    p.set_defaults(func=_cmd_scaling)


def register(sub: argparse._SubParsersAction) -> None:
    _register_report(sub)
    _register_scaling(sub)
