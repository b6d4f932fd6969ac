"""Start SGLang servers outside Ray with exactly the argv/env our SglangBackend builds (GPU machine only).

For the comparisons next to our Ray path: the PD pair that SGLang's own router fronts, and a plain
aggregated server for the greedy correctness check. Each server runs in its own session (it outlives
this script, and a later device call in the same lease can use it); its pid, url and argv go to
STATE_DIR/<name>.json, its log to STATE_DIR/<name>.log.
  start --config C --role prefill|decode|aggregated --gpu N[,M..] --port P [--bootstrap-port B] --name X --state-dir D
  wait  --state-dir D NAME... [--timeout-s T]     readiness as the worker checks it + /server_info startup_time
  stop  --state-dir D NAME...                      SIGTERM then SIGKILL each server's process group
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def cmd_start(args: argparse.Namespace) -> int:
    from orchestrator.config import load_config
    from orchestrator.engines.base import EngineProcess, WorkerPlacement
    from orchestrator.engines.sglang.launch import SglangBackend

    cfg = load_config(args.config, args.overrides)
    group = getattr(cfg.layout, args.role)[0]
    placement = WorkerPlacement(role=args.role, group_index=0, replica_index=0, host="127.0.0.1",
                                advertise_host="127.0.0.1", port=args.port, bootstrap_port=args.bootstrap_port,
                                gpu_ids=tuple(int(g) for g in args.gpu.split(",")), node_ip="127.0.0.1")
    launch = SglangBackend().build_launch(cfg, group, placement)
    state = Path(args.state_dir)
    proc = EngineProcess(launch, state / f"{args.name}.log")
    proc.start()
    info = {"name": args.name, "pid": proc.proc.pid, "url": launch.url, "argv": launch.argv, "env": launch.env,
            "launch": asdict(launch), "bootstrap_port": launch.bootstrap_port, "started_at": proc.started_at}
    (state / f"{args.name}.json").write_text(json.dumps(info, indent=1))
    print(f"{args.name}: pid {proc.proc.pid} {launch.url}\n  {' '.join(launch.argv)}")
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    from orchestrator.engines.base import EngineLaunch
    from orchestrator.engines.sglang.launch import startup_time, wait_ready

    state = Path(args.state_dir)
    deadline = time.monotonic() + args.timeout_s
    rc = 0
    for name in args.names:
        info = json.loads((state / f"{name}.json").read_text())
        launch = EngineLaunch(**info["launch"])
        try:
            wait_ready(launch, max(1.0, deadline - time.monotonic()), poll_s=1.0)
        except TimeoutError as exc:
            print(f"{name}: {exc}")
            rc = 1
            continue
        info["ready_after_s"] = time.time() - info["started_at"]
        info["startup_time"] = startup_time(info["url"])
        (state / f"{name}.json").write_text(json.dumps(info, indent=1))
        print(f"{name}: ready after {info['ready_after_s']:.0f}s; startup_time {json.dumps(info['startup_time'])}")
    return rc


def cmd_stop(args: argparse.Namespace) -> int:
    state = Path(args.state_dir)
    for name in args.names:
        try:
            pid = json.loads((state / f"{name}.json").read_text())["pid"]
        except (OSError, KeyError, ValueError):
            continue
        for sig, wait_s in ((signal.SIGTERM, 8.0), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + wait_s
            while time.monotonic() < end:
                try:
                    os.killpg(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
        print(f"{name}: stopped (pgid {pid})")
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--config", required=True)
    s.add_argument("--set", dest="overrides", action="append", default=[])
    s.add_argument("--role", choices=("prefill", "decode", "aggregated"), required=True)
    s.add_argument("--gpu", required=True, help="GPU id, or a comma list for a TP > 1 server (0,1)")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--bootstrap-port", type=int, default=None)
    s.add_argument("--name", required=True)
    s.add_argument("--state-dir", required=True)
    s.set_defaults(func=cmd_start)
    w = sub.add_parser("wait")
    w.add_argument("--state-dir", required=True)
    w.add_argument("names", nargs="+")
    w.add_argument("--timeout-s", type=float, default=300)
    w.set_defaults(func=cmd_wait)
    t = sub.add_parser("stop")
    t.add_argument("--state-dir", required=True)
    t.add_argument("names", nargs="+")
    t.set_defaults(func=cmd_stop)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
