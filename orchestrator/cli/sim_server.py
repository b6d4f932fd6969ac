"""`pd-orchestrator sim-server --mode prefill|decode|null --port P`: one simulated SGLang server by hand."""

from __future__ import annotations

import argparse

from orchestrator.engines.sim.server import run_server
from orchestrator.engines.sim.settings import add_server_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim-server", help="run one simulated SGLang engine server (prefill, decode or aggregated)")
    add_server_args(p)
    p.set_defaults(func=run_server)
