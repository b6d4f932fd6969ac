"""The two-GPU calibration (issue 29's run of `calibrate twogpu`) against what the cost model predicts for the same
servers and messages (orchestrator/perfmodel/parallel/two_gpu_vs_model.py): NCCL all-reduce / all-to-all / send
times against parallel/collectives.py's published figures, each layout's decode steps (TP2, DP-attention 2 + EP2,
PP2, eager TP2) against the model's step at that batch and context, and prefill latencies against the model's
chunking.

Usage (repo root; virtual time, no GPU):
  .venv/bin/python benchmarks/two_gpu_vs_model.py benchmarks/results/<date>-two-gpu<...>/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.perfmodel.parallel.two_gpu_vs_model import vs_model_report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="the two-GPU results folder (searched for collectives.json and "
                    "calibration-twogpu*.json)")
    args = ap.parse_args(argv)
    try:
        lines = vs_model_report(args.results)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
