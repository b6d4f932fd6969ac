"""`pd-orchestrator plan` (memory + deadline preflight, layout search, the back-tests) and `pd-orchestrator compare`
(A/B): both commands' arguments.

register -> finite.py (plan of a finite batch; routes --backtest to backtest.py and a closed-loop workload to
closed_loop.py) | compare.py; placement.py and bands.py: the lines both plans print (placement, the back-test band).
"""

from __future__ import annotations

import argparse

from orchestrator.cli.args import add_config_args, add_overrides
from orchestrator.cli.plan.compare import cmd_compare
from orchestrator.cli.plan.finite import cmd_plan
from orchestrator.perfmodel.gpus import GPU_SPECS
from orchestrator.plan.proposals import add_search_args


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--synthetic", action="store_true",
        help="use a synthetic ShareGPT-shaped batch instead of sampling ShareGPT (faster; less faithful)",
    )
    parser.add_argument("--disk-gb-s", type=float, default=2.0, help="weight read speed per node for real weights (GB/s)")
    parser.add_argument(
        "--jit-cold", action="store_true",
        help="engine start with empty compile caches (a fresh machine: every CUDA-graph batch size and the first "
        "forwards compile); the plan prints both the cold and the warm start either way",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="memory + deadline preflight of a config; --search ranks the layouts that fit (simulated)",
    )
    add_config_args(p, required=False, help="run config YAML (see configs/); not needed with --backtest")
    p.add_argument("--gpu", choices=sorted(GPU_SPECS), help="target GPU (default: cluster.gpu)")
    p.add_argument(
        "--backtest", action="store_true",
        help="reprint the back-test: every recorded real run predicted from its conditions with the shipped "
        "calibration profiles (benchmarks/backtest/runs.yaml), measured vs predicted and the error",
    )
    p.add_argument("--markdown", action="store_true", help="with --backtest: a Markdown table (docs/fidelity.md)")
    p.add_argument("--closed-loop", action="store_true",
                   help="with --backtest: the closed-loop (AIPerf goodput) rows of benchmarks/backtest/closed_loop.yaml "
                   "instead: predicted now vs measured, the bound set before each run, a pre-registered prediction's error")
    p.add_argument("--search", action="store_true", help="enumerate layouts of the cluster and rank them")
    p.add_argument("--top", type=int, default=None,
                   help="with --search: print the best N layouts, and write them with --write-dir (default: 25 "
                   "printed, 3 written)")
    p.add_argument("--write-dir", help="write the top layouts here as ready run configs")
    p.add_argument("--concurrency", help="closed-loop workloads: the declared concurrencies N to predict, "
                   "comma-separated, e.g. 24,32,48 (default benchmark.concurrency)")
    p.add_argument("--json", metavar="PATH", help="closed-loop workloads: write the per-N rows (concurrency, "
                   "output_tok_s, good_output_tok_s, good_fraction, ttft_ms, itl_ms), the best N and the time to ready")
    add_search_args(p)
    _add_common(p)
    p.set_defaults(func=cmd_plan)

    c = sub.add_parser("compare", help="A/B: the same sampled batch on several configs, one table")
    c.add_argument("--configs", nargs="+", required=True, metavar="CONFIG.yaml", help="configs to compare; ratios are to the first")
    mode = c.add_mutually_exclusive_group()
    mode.add_argument("--simulate", action="store_true", default=True, help="virtual-time simulation (default)")
    mode.add_argument("--real", action="store_true", help="run each config for real with `bench` (slow; needs the cluster)")
    add_overrides(c, help="override one config key (applied to every config), e.g. --set benchmark.num_prompts=200")
    _add_common(c)
    c.set_defaults(func=cmd_compare)
