"""`pd-orchestrator preflight --config X`: NIXL KV-shaped transfer prefill -> decode before any engine starts.

Also `pd-orchestrator calibrate ...`: the other measurement on the GPU machine itself (real SGLang start-up,
prefill, decode, PD KV transfer; arguments and runs in orchestrator/calibrate/command.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from orchestrator.calibrate import command as calibrate_command
from orchestrator.cli.args import add_config_args, config_from_args
from orchestrator.transfer.layout import PreflightError
from orchestrator.transfer.preflight import run_preflight


def _cmd_preflight(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.mode == "ray" or (args.mode == "auto" and not cfg.cluster.is_local):
        from orchestrator.cluster.connect import init_driver

        init_driver(None if cfg.cluster.address == "auto" else cfg.cluster.address, namespace=None)
    try:
        report = run_preflight(cfg, target_bytes=int(args.mib * 2**20), iterations=args.iterations,
                               memory=args.memory, mode=args.mode, timeout_s=args.timeout_s,
                               work_dir=args.work_dir)
    except PreflightError as exc:
        print(f"preflight FAILED: {exc}", file=sys.stderr)
        return 1
    print("\n".join(report.lines()))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(asdict(report), indent=2))
    if not report.ok:
        return 1
    if args.strict and report.gpudirect.startswith("NOT"):
        return 3
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preflight", help="NIXL transfer test prefill -> decode (bandwidth, transport, bytes)")
    add_config_args(p)
    p.add_argument("--mib", type=float, default=64, help="KV bytes per transfer, MiB (default 64)")
    p.add_argument("--iterations", type=int, default=5, help="transfers; the first is not timed (default 5)")
    p.add_argument("--memory", choices=("auto", "gpu", "cpu"), default="auto", help="auto: GPU when present")
    p.add_argument("--mode", choices=("auto", "local", "ray"), default="auto",
                   help="auto: two local processes for cluster.address=local, else Ray actors by role label")
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--work-dir", default=None, help="where UCX logs go (default: a temp dir)")
    p.add_argument("--json", default=None, help="also write the report as JSON here")
    p.add_argument("--strict", action="store_true", help="exit 3 when GPUDirect RDMA is not active")
    p.set_defaults(func=_cmd_preflight)
    c = sub.add_parser("calibrate", help="measure real SGLang on this GPU machine: start-up cold/warm, prefill, "
                                         "decode vs batch/context, knobs, one-GPU PD KV transfer (writes raw JSON)")
    calibrate_command.add_arguments(c)
    c.set_defaults(func=calibrate_command.run)
