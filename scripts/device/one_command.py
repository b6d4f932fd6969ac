"""Run one `pd-orchestrator` subcommand importing only its module (the GPU image lacks some CLI deps).
Usage: python scripts/device/one_command.py orchestrator.cli.bench bench --config X [--set K=V ...]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

if __name__ == "__main__":
    from orchestrator.config import ConfigError

    parser = argparse.ArgumentParser(prog="one_command")
    importlib.import_module(sys.argv[1]).register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(sys.argv[2:])
    try:
        raise SystemExit(int(args.func(args) or 0))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None
