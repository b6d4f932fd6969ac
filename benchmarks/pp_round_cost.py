"""The PP stage iteration's cost (perfmodel/parallel/pipeline.py ITERATION_S, ITERATION_PER_REQUEST_S) from the PP2
decode points of a two-GPU calibration run: round = pp x (stage(B / m) + c0 + c1 x B / m), the stage forward the
model's (the GPU's R1-shaped profile over a stage's own layers; with unequal stages the slowest, as
pipeline.decode_round_s takes it at m = pp, and their mean at m = 1), c0 and c1 by least squares; then the
residual of each point with the shipped constants (pipeline.decode_round_s).

Usage (repo root; no GPU):
  .venv/bin/python benchmarks/pp_round_cost.py benchmarks/results/2026-11-26-two-gpu-h200x2/call1-calibration/calibration-twogpu.json.xz
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from orchestrator.compressed import read_text
from orchestrator.perfmodel.parallel.two_gpu_vs_model import server_model
from orchestrator.perfmodel.from_raw import gpu_key
from orchestrator.perfmodel.parallel import pipeline


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path, help="calibration-twogpu.json with a pp2 run")
    args = ap.parse_args(argv)
    raw = json.loads(read_text(args.raw))
    runs = [r for r in raw["runs"] if r.get("variant") == "pp2" and r.get("decode")]
    if not runs:
        print(f"{args.raw}: no pp2 decode points", file=sys.stderr)
        return 2
    layers = int(raw["model"]["config"]["num_hidden_layers"])
    model = server_model(runs[0], gpu_key(raw["gpu"]["name"]), layers)
    pp = model.pp
    points = []
    for p in runs[0]["decode"]:
        if not p.get("step_ms_median"):
            continue
        batch = int(p["batch_size"])
        micro = pipeline.micro_batches(batch, pp)
        per_micro = math.ceil(batch / micro)
        stages = [model._decode_pass_s(per_micro, per_micro * (p["context_tokens"] + 50), False, 1, k) for k in range(pp)]
        points.append((batch, micro, per_micro, p["step_ms_median"] / 1e3, stages))
    # the round as a function of (c0, c1): pp x the slowest stage when every stage is busy (m = pp), else the sum
    def bound(m: int, stages: list[float]) -> float:
        return pp * max(stages) if m == pp else sum(stages)

    x = np.array([[pp, pp * per] for _, _, per, _, _ in points])
    y = np.array([round_s - bound(m, stages) for _, m, _, round_s, stages in points])
    (c0, c1), *_ = np.linalg.lstsq(x, y, rcond=None)
    print(f"{args.raw} ({raw['gpu']['name']}, R1 shape x {layers} layers, pp {pp}, profile "
          f"{model.calibration.profile if model.calibration else None})")
    print(f"fit: ITERATION_S = {c0 * 1e3:.2f} ms, ITERATION_PER_REQUEST_S = {c1 * 1e6:.1f} us "
          f"(shipped: {pipeline.ITERATION_S * 1e3:.2f} ms, {pipeline.ITERATION_PER_REQUEST_S * 1e6:.1f} us)")
    errors = []
    for batch, micro, per_micro, round_s, stages in points:
        model_s = pipeline.decode_round_s(stages, micro, per_micro)
        errors.append(model_s / round_s - 1)
        print(f"  B={batch:4d}: measured {round_s * 1e3:6.2f} ms, stage forwards "
              f"{' / '.join(f'{s * 1e3:.2f}' for s in stages)} ms, "
              f"round with the shipped constants {model_s * 1e3:6.2f} ms ({errors[-1]:+.1%})")
    print(f"RMS {math.sqrt(sum(e * e for e in errors) / len(errors)):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
