"""`pd-orchestrator` command line: each subcommand lives in the module that does the work.

A command module exposes `register(subparsers)` which adds its parser and sets `func(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from orchestrator.config import ConfigError, dump_config, load_config

# Modules that contribute subcommands, in the order they appear in --help.
COMMAND_MODULES = [
    "orchestrator.bench",
    "orchestrator.cluster",
    "orchestrator.plan.cli",
    "orchestrator.fabric",
    "orchestrator.monitor",
    "orchestrator.sweep",
    "orchestrator.mlperf",
    "orchestrator.sim.server",
]


def add_config_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """--config FILE plus repeatable --set KEY.PATH=VALUE overrides (e.g. layout.prefill.0.count=2)."""
    parser.add_argument("--config", "-c", required=required, help="run config YAML (see configs/)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override one config key, e.g. --set layout.prefill.0.count=2 (repeatable)",
    )


def config_from_args(args: argparse.Namespace):
    return load_config(args.config, args.overrides)


def _cmd_config_validate(args: argparse.Namespace) -> int:
    cfg = load_config(args.file, args.overrides)
    print(f"{args.file}: OK ({cfg.layout.describe()}, engine={cfg.engine.kind}, model={cfg.model.name})")
    return 0


def _cmd_config_show(args: argparse.Namespace) -> int:
    print(dump_config(load_config(args.file, args.overrides)), end="")
    return 0


def _register_config(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="validate or show a run config")
    csub = p.add_subparsers(dest="config_cmd", required=True)
    for name, func, helptext in (
        ("validate", _cmd_config_validate, "check a config; one line per problem"),
        ("show", _cmd_config_show, "print the resolved config with every default"),
    ):
        cp = csub.add_parser(name, help=helptext)
        cp.add_argument("file")
        cp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
        cp.set_defaults(func=func)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pd-orchestrator",
        description="Place SGLang prefill/decode workers on Ray, route requests, benchmark and observe.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _register_config(sub)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # command module not written yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
