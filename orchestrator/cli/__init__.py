"""`pd-orchestrator` command line: the one list of commands, each declared and run by one module of this package.

argv -> build_parser() (COMMANDS: command -> module with `register(subparsers)`) -> args.func(args) -> exit code.
Modules are imported by name so `scripts/device/one_command.py` can load one command without the others'
dependencies; `--config/--set` are declared once, in `orchestrator.cli.args`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from orchestrator.config import ConfigError
from orchestrator.run.driver import BenchInterrupted

# Every command, in --help order, with the module that declares its arguments and runs it.
COMMANDS: dict[str, str] = {
    "config": "orchestrator.cli.config",
    "plan": "orchestrator.cli.plan",
    "compare": "orchestrator.cli.plan",
    "cluster": "orchestrator.cli.cluster",
    "jobscript": "orchestrator.cli.jobscript",
    "preflight": "orchestrator.cli.preflight",
    "calibrate": "orchestrator.cli.preflight",
    "prepare": "orchestrator.cli.prepare",
    "bench": "orchestrator.cli.bench",
    "serve": "orchestrator.cli.bench",
    "report": "orchestrator.cli.report",
    "scaling": "orchestrator.cli.report",
    "monitor": "orchestrator.cli.monitor",
    "dashboards": "orchestrator.cli.monitor",
    "sweep": "orchestrator.cli.serving",
    "accuracy": "orchestrator.cli.serving",
    "mlperf": "orchestrator.cli.serving",
    "goodput": "orchestrator.cli.serving",
    "sim-server": "orchestrator.cli.sim_server",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pd-orchestrator",
        description="Place SGLang prefill/decode workers on Ray, route requests, benchmark and observe.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in dict.fromkeys(COMMANDS.values()):
        importlib.import_module(module).register(sub)
    if set(sub.choices) != set(COMMANDS):  # a module added or lost a command without this list saying so
        raise RuntimeError(f"commands registered {sorted(sub.choices)} differ from COMMANDS {sorted(COMMANDS)}")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except (KeyboardInterrupt, BenchInterrupted) as exc:  # BenchInterrupted: SIGINT/SIGTERM once Ray is up
        print(f"interrupted{': ' + str(exc) if str(exc) else ''}", file=sys.stderr)
        return 130
