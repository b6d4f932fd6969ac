"""The arguments every config-driven command shares: `--config FILE` and repeatable `--set KEY.PATH=VALUE`."""

from __future__ import annotations

import argparse
import hashlib

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
    """The config with its overrides; a config changed by --set gets a name of its own (and so run ids):
    `default-set-<6 hex of the overrides>`, unless an override sets `name` itself."""
    cfg = load_config(args.config, args.overrides)
    if args.overrides and not any(o.split("=", 1)[0].strip() == "name" for o in args.overrides):
        digest = hashlib.sha1("\n".join(args.overrides).encode()).hexdigest()[:6]
        cfg = cfg.model_copy(update={"name": f"{cfg.name}-set-{digest}"})
    return cfg


def optional_config_from_args(args: argparse.Namespace) -> RunConfig | None:
    """The config when --config was given (commands that also work on a bare --url), else None."""
    return config_from_args(args) if args.config else None
