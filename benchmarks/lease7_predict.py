"""The planner's eager decode step for each server of lease 7 (issue 25, scripts/device/eager_profile.sh), printed
before the lease: A (the aggregated TP 1 V2-Lite row through the product), B1 (a lone TP 1 server, 330-token prompts,
64 out, batch 300 / 450 / 600), B1p (its profiled round: 600 prompts, 256 out), B5 (the 1000 ShareGPT prompts straight
to the lone server) and the PD decode (the optional second call), on H100-SXM and H200. Each row is the planner's
step = max(GPU work, CPU launch) with both parts, as benchmarks/eager_inrun_predict.py (lease 5) prints them.

Contexts per request: B1 330 + 32 (the round's mean), B1p 330 + 128, A / B5 / PD 360 (ShareGPT's mean prompt 341
plus part of its output, lease 5's in-run figure). The model has no in-run term: A, B5 and a lone server at equal
batch and context get the same step.

Usage (repo root, no GPU): .venv/bin/python benchmarks/lease7_predict.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.eager_inrun_predict import AGG, PD, server_model, server_rows  # noqa: E402
from orchestrator.records import Role  # noqa: E402

GPUS = ("H100-SXM", "H200")
TP1 = ["layout.aggregated.0.tp=1", "layout.aggregated.0.mem_fraction_static=0.65"]
SERVERS: dict[str, tuple[str, Role, list[str], list[int], float]] = {   # name -> (config, role, sets, batches, context per request)
    "B1 lone TP 1, 330 in / 64 out": (AGG, "aggregated", TP1, [300, 450, 600], 330 + 64 / 2),
    "B1p lone TP 1, 330 in / 256 out (profiled round)": (AGG, "aggregated", TP1, [600], 330 + 256 / 2),
    "A aggregated TP 1 in-run / B5 ShareGPT direct": (AGG, "aggregated", TP1, [257, 300, 400, 500, 600, 700, 800, 900], 360.0),
    "PD decode in-run (second call)": (PD, "decode", ["layout.decode.0.mem_fraction_static=0.65"],
                                       [257, 300, 400, 500, 600, 700], 360.0),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args(argv)
    out: dict = {}
    for gpu in GPUS:
        for name, (config, role, sets, batches, ctx) in SERVERS.items():
            model = server_model(config, role, sets, gpu)
            out.setdefault(gpu, {})[name] = server_rows(model, batches, ctx, f"{name} on {gpu}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
