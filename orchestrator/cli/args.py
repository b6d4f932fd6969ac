"""The arguments every config-driven command shares: `--config FILE` and repeatable `--set KEY.PATH=VALUE`."""

from __future__ import annotations

import argparse

from orchestrator.config import RunConfig, load_config

SET_HELP = "override one config key, e.g. --set layout.prefill.0.count=2 (repeatable)"


def add_overrides(parser: argparse.ArgumentParser, help: str = SET_HELP) -> None:
    """Repeatable --set KEY.PATH=VALUE, collected in `args.overrides`."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE", help=help)


def add_config_args(parser: argparse.ArgumentParser, required: bool = True,
                    help: str = "run config YAML (see configs/)") -> None:
    """--config FILE plus repeatable --set KEY.PATH=VALUE overrides (e.g. layout.prefill.0.count=2)."""
    parser.add_argument("--config", "-c", required=required, help=help)
    add_overrides(parser)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    return load_config(args.config, args.overrides)


def optional_config_from_args(args: argparse.Namespace) -> RunConfig | None:
    """The config when --config was given (commands that also work on a bare --url), else None."""
    return config_from_args(args) if args.config else None
