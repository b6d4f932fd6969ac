"""`pd-orchestrator accuracy check|record-reference|record-baseline`, and the gate flags sweep shares."""

from __future__ import annotations

import argparse
import sys

from orchestrator.api.client import auth_headers
from orchestrator.cli.args import add_config_args, optional_config_from_args
from orchestrator.run.accuracy import AccuracyGateError, AccuracyGateSpec, record_baseline, record_reference, run_gate


def add_gate_args(parser: argparse.ArgumentParser) -> None:
    """The gate's flags, shared by every command that runs it."""
    parser.add_argument("--accuracy", choices=["auto", "token-match", "bpb", "off"], default="auto",
                        help="accuracy gate before benchmarking (auto: bpb with real weights, else token-match)")
    parser.add_argument("--accuracy-reference", help="token-match reference: aggregated server URL or reference JSON")
    parser.add_argument("--accuracy-baseline", help="bpb baseline JSON (from `accuracy record-baseline`)")
    parser.add_argument("--accuracy-tolerance", type=float, default=0.02, help="bpb: allowed relative deviation")
    parser.add_argument("--accuracy-prompts", type=int, default=8, help="token-match: number of fixed prompts")
    parser.add_argument("--accuracy-tokens", type=int, default=32, help="token-match: greedy tokens per prompt")


def spec_from_args(args: argparse.Namespace) -> AccuracyGateSpec:
    return AccuracyGateSpec(
        mode=args.accuracy, reference=args.accuracy_reference, baseline=args.accuracy_baseline,
        tolerance=args.accuracy_tolerance, num_prompts=args.accuracy_prompts, max_new_tokens=args.accuracy_tokens,
    )


def _cmd_check(args: argparse.Namespace) -> int:
    cfg = optional_config_from_args(args)
    try:
        result = run_gate(spec_from_args(args), args.url, cfg, auth_headers(cfg.router.api_key_env if cfg else None))
    except AccuracyGateError as exc:
        print(f"accuracy gate could not run: {exc}", file=sys.stderr)
        return 2
    print(f"accuracy gate [{result.mode}]: {'PASS' if result.passed else 'FAIL'}: {result.detail}")
    return 0 if result.passed else 1


def _cmd_record_reference(args: argparse.Namespace) -> int:
    spec = AccuracyGateSpec(num_prompts=args.accuracy_prompts, max_new_tokens=args.accuracy_tokens)
    record = record_reference(args.url, args.out, spec)
    print(f"wrote {args.out}: {len(record['prompts'])} prompts x {record['max_new_tokens']} tokens from {args.url}")
    return 0


def _cmd_record_baseline(args: argparse.Namespace) -> int:
    record = record_baseline(args.url, args.out)
    print(f"wrote {args.out}: bpb {record['bpb']:.4f} over {record['text_bytes']} bytes from {args.url}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """`pd-orchestrator accuracy check|record-reference|record-baseline`."""
    p = sub.add_parser("accuracy", help="accuracy gate: check a server, or record its reference/baseline")
    asub = p.add_subparsers(dest="accuracy_cmd", required=True)
    check = asub.add_parser("check", help="run the gate against --url; exit 1 when outputs are wrong")
    check.add_argument("--url", required=True, help="server or router to check")
    add_config_args(check, required=False, help="run config (decides auto mode; sim gets a local reference)")
    add_gate_args(check)
    check.set_defaults(func=_cmd_check)
    ref = asub.add_parser("record-reference", help="store an aggregated server's greedy outputs")
    ref.add_argument("--url", required=True)
    ref.add_argument("--out", required=True)
    ref.add_argument("--accuracy-prompts", type=int, default=8)
    ref.add_argument("--accuracy-tokens", type=int, default=32)
    ref.set_defaults(func=_cmd_record_reference)
    base = asub.add_parser("record-baseline", help="store bits-per-byte of the fixed text on a trusted server")
    base.add_argument("--url", required=True)
    base.add_argument("--out", required=True)
    base.set_defaults(func=_cmd_record_baseline)
