"""`pd-orchestrator cluster up --local | status | down | sockets`: the local 2-node Ray cluster, and who listens where."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.cli.args import add_config_args, config_from_args
from orchestrator.cluster.local import DEFAULT_STATE_PATH, LocalCluster, LocalClusterState, ray_env
from orchestrator.config import ClusterConfig, RunConfig
from orchestrator.process import pid_alive


def _cluster_cfg(args: argparse.Namespace) -> RunConfig:
    if args.config:
        return config_from_args(args)
    from orchestrator.config import load_config

    return load_config(Path(__file__).resolve().parents[2] / "configs" / "default.yaml", args.overrides)


def _cmd_up(args: argparse.Namespace) -> int:
    cfg = _cluster_cfg(args)
    if not args.local and not cfg.cluster.is_local:
        print("cluster up starts local clusters only (--local); a real cluster is started with `ray start`,"
              " see docs/running.md", file=sys.stderr)
        return 2
    existing = LocalClusterState.load(args.state)
    if existing is not None and existing.alive():
        print(f"already running: {existing.gcs_address} (dashboard {existing.dashboard_url})")
        return 0
    state = LocalCluster(cfg.cluster, args.state).start()
    print(f"local Ray cluster up: address {state.gcs_address}, dashboard {state.dashboard_url}")
    for n in state.nodes:
        gpus = f"GPUs {','.join(n.gpus)}" if n.gpus else f"{state.gpus_per_node} logical GPUs"
        print(f"  node {state.label_key}={n.role}: pid {n.pid}, {gpus}, temp dir {n.temp_dir}, "
              f"metrics :{n.metrics_export_port}")
    print(f"export RAY_API_SERVER_ADDRESS={state.dashboard_url} RAY_AUTH_MODE={ray_env()['RAY_AUTH_MODE']}"
          "   # for `ray job submit`")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    state = LocalClusterState.load(args.state)
    if state is None:
        print(f"no local cluster recorded in {args.state}")
        return 0
    cluster = LocalCluster(ClusterConfig(), args.state)
    cluster.state = state
    cluster.stop()
    print(f"stopped local Ray cluster {state.gcs_address} (pids {[n.pid for n in state.nodes]})")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    state = LocalClusterState.load(args.state)
    if state is None:
        print(f"no local cluster recorded in {args.state}")
        return 1
    alive = state.alive()
    print(f"{state.gcs_address}: {'up' if alive else 'DOWN'} (dashboard {state.dashboard_url})")
    for n in state.nodes:
        print(f"  {state.label_key}={n.role}: pid {n.pid} {'alive' if pid_alive(n.pid) else 'gone'}")
    return 0 if alive else 1


def _cmd_sockets(args: argparse.Namespace) -> int:
    from orchestrator.cluster.listening import main

    return main()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="start/stop/inspect the local 2-node Ray cluster")
    csub = p.add_subparsers(dest="cluster_cmd", required=True)
    for name, func, helptext in (
        ("up", _cmd_up, "start a local labelled 2-node Ray cluster (head=prefill, raylet=decode)"),
        ("down", _cmd_down, "stop exactly the processes `cluster up` started"),
        ("status", _cmd_status, "is the recorded local cluster running?"),
    ):
        cp = csub.add_parser(name, help=helptext)
        if name == "up":
            add_config_args(cp, required=False)
            cp.add_argument("--local", action="store_true", help="start it on this machine")
        cp.add_argument("--state", type=Path, default=DEFAULT_STATE_PATH, help="state file (PIDs, addresses)")
        cp.set_defaults(func=func)
    sockets = csub.add_parser("sockets", help="every listening TCP socket of this machine and its process, exposed first")
    sockets.set_defaults(func=_cmd_sockets)
