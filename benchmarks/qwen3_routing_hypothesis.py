"""A named hypothesis, priced before the run that tests it: dummy weights route Qwen3's tokens to (nearly) the same experts.

    .venv/bin/python benchmarks/qwen3_routing_hypothesis.py [--config configs/device-h200x2-qwen3-serve.yaml]

The planner routes a Qwen3 decode batch uniformly over its 128 experts (perfmodel/weights.dummy_routing: only R1's
noaux_tc router is measured to collapse under dummy weights). On the one-H100 pair the inter-token times measured
while no prefill ran (AIPerf's p25: ~2.0 ms at N = 4, ~2.3 ms at N = 16) barely grow with the batch, where uniform
routing reads 29 -> 82 experts per layer (3.0 -> 5.7 ms); reading only top_k = 8 experts gives 2.1 / 2.3 ms. That
agreement was seen on the rows the hypothesis would be judged on, so it is not put in the model; this prints, for the
two-GPU pair, the decode step and the closed-loop prediction under both routings, to be compared with that run's
measurement (which neither was fitted on). The only change under the hypothesis: server/forward.py's dummy_routing answers True
for this model (so a step reads top_k experts per MoE layer: no expert count was measured for Qwen3's router).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.server import forward  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.plan.closedloop.client import ClosedLoopLoad, simulate_closed_loop  # noqa: E402


def predictions(config: str, gpu: str) -> list[str]:
    cfg = load_config(ROOT / config, [f"cluster.gpu={gpu}"], paths_from=ROOT)
    decode = cost_model_for(cfg, "decode", cfg.layout.decode[0])
    lines = []
    for label, same in (("uniform routing (the model)", False), ("same experts (hypothesis)", True)):
        with mock.patch.object(forward, "dummy_routing", lambda load_format, topk, same=same: same and load_format == "dummy"):
            steps = ", ".join(f"batch {b}: {decode.decode_step_s(b, b * 4100) * 1e3:.2f} ms" for b in (1, 4, 16, 64))
            lines.append(f"{gpu} {label}: decode step at context 4,100 per request: {steps}")
            for n in cfg.benchmark.concurrency:
                run = simulate_closed_loop(cfg, ClosedLoopLoad.of(cfg, n))
                lines.append(f"  N={n:<3} output {run.output_tok_s:7,.0f} tok/s  TTFT p50 {run.ttft_ms()['p50']:6.1f} ms  "
                             f"ITL p50 {run.itl_ms()['p50']:5.2f} ms")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/device-h200x2-qwen3-serve.yaml",
                   help="a relative path is read from the repository root, as are the model folders it names")
    p.add_argument("--gpus", default="H200,H100-SXM")
    args = p.parse_args(argv)
    for gpu in args.gpus.split(","):
        print("\n".join(predictions(args.config, gpu)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
