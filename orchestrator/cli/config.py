"""`pd-orchestrator config validate|show FILE [--set K=V]`: check a run config or print it with every default."""

from __future__ import annotations

import argparse

from orchestrator.cli.args import add_overrides
from orchestrator.cluster.inventory import ClusterError, check_declared_placement
from orchestrator.config import ConfigError, dump_config, load_config


def _cmd_config_validate(args: argparse.Namespace) -> int:
    cfg = load_config(args.file, args.overrides)
    try:
        check_declared_placement(cfg)
    except ClusterError as exc:
        raise ConfigError(args.file, str(exc).splitlines()) from None
    print(f"{args.file}: OK ({cfg.layout.describe()}, engine={cfg.engine.kind}, model={cfg.model.name})")
    return 0


def _cmd_config_show(args: argparse.Namespace) -> int:
    print(dump_config(load_config(args.file, args.overrides)), end="")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="validate or show a run config")
    csub = p.add_subparsers(dest="config_cmd", required=True)
    for name, func, helptext in (
        ("validate", _cmd_config_validate, "check a config; one line per problem"),
        ("show", _cmd_config_show, "print the resolved config with every default"),
    ):
        cp = csub.add_parser(name, help=helptext)
        cp.add_argument("file")
        add_overrides(cp)
        cp.set_defaults(func=func)
