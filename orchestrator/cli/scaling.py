"""`pd-orchestrator scaling`: throughput against GPU count and layout, as a table and a plot.

Measured rows come from real runs' result.json (also inside raw archives) under --results; simulated rows
time each --configs layout, and the same layout on --nodes other node counts, with the cost model. Every
row says which it is and where it came from.
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _cmd_scaling(args: argparse.Namespace) -> int:
    from orchestrator.observe.scaling import measured_rows, simulated_rows, table, write

    configs = args.configs if args.configs is not None else sorted((REPO / "configs").glob("*.yaml"))
    rows = measured_rows(args.results) + simulated_rows(configs, args.nodes, synthetic=args.synthetic)
    print(table(rows))
    for kind, path in write(rows, Path(args.out)).items():
        print(f"{kind}: {path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scaling", help="throughput vs GPU count and layout: measured runs + simulated layouts, table and plot")
    p.add_argument("--results", nargs="*", default=[str(REPO / "benchmarks" / "results")],
                   help="folders (or files) searched for real runs' result.json, also inside .tar.xz archives")
    p.add_argument("--configs", nargs="*", default=None, help="configs to simulate (default: every configs/*.yaml)")
    p.add_argument("--nodes", nargs="*", type=int, default=[1, 2, 4],
                   help="node counts each layout is scaled to (server counts scale with the nodes)")
    p.add_argument("--synthetic", action="store_true", help="ShareGPT-shaped synthetic batch instead of ShareGPT")
    p.add_argument("--out", default="runs/scaling", help="folder for scaling.png, scaling.md, scaling.json")
    p.set_defaults(func=_cmd_scaling)
