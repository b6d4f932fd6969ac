"""`pd-orchestrator bench --config X`: the offline benchmark; prints SGLang's result block and the verdict.
`pd-orchestrator serve --config X [--detach]`: the same deployment kept up as an OpenAI gateway until SIGTERM /
Ctrl-C / `serve down`; `serve status | apply | down` talk to a running one."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from orchestrator.cli.args import add_config_args, config_from_args
from orchestrator.run.bench import run_bench


def _cmd_bench(args: argparse.Namespace) -> int:
    started_at = time.time()
    cfg = config_from_args(args)
    if cfg.benchmark.closed_loop:
        print(f"bench: benchmark.kind=closed_loop in {args.config}: bench runs a prompt batch; measure a closed loop "
              "with `serve` + `goodput` (predict it with `plan`), or set benchmark.kind: batch", file=sys.stderr)
        return 2
    if args.quiet:
        logging.getLogger("ray").setLevel(logging.WARNING)
    result = run_bench(cfg, force=args.force, quiet=args.quiet, num_prompts=args.num_prompts,
                       result_dir=args.result_dir, started_at=started_at)
    first, *detail = (result.verdict.why_invalid() or "").splitlines() or [""]  # VALID: no reason
    if not result.valid:  # the whole reason first, where the eye lands after the live view
        print("\n".join([f"INVALID: {first}", *detail]) + "\n")
    print(result.text())
    print(f"result: {result.result_path}")
    if result.report_path is not None:
        print(f"report: {result.report_path}")
    if not result.valid:
        if detail:
            print("\n".join(detail))
        print(f"INVALID: {first}", flush=True)  # and last: the last line of the output (and job log)
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="offline benchmark: place workers, run the ShareGPT batch, print the result block")
    add_config_args(p)
    p.add_argument("--quiet", action="store_true", help="only the result block and the verdict")
    p.add_argument("--force", action="store_true", help="run even if the memory preflight says it does not fit")
    p.add_argument("--num-prompts", type=int, default=None, help="override benchmark.num_prompts")
    p.add_argument("--result-dir", default=None, help="override benchmark.result_dir (result.json goes below)")
    p.set_defaults(func=_cmd_bench)
    register_serve(sub)


def _cmd_serve(args: argparse.Namespace) -> int:
    from orchestrator.run.serving.control import find_service, state_dir
    from orchestrator.run.serving.lifecycle import run_serve

    if args.serve_cmd is not None:
        return SERVE_COMMANDS[args.serve_cmd](args)
    if not args.config:
        print("serve: give --config X (start a service) or a subcommand: status | apply | down", file=sys.stderr)
        return 2
    cfg = config_from_args(args)
    directory = state_dir(args.state_dir)
    try:
        running = find_service(directory, cfg.name)
    except Exception:
        running = None
    if running is not None:
        print(f"serve: a service named {cfg.name} already runs (pid {running['pid']}, {running['gateway']}); "
              f"`pd-orchestrator serve down --name {cfg.name}` or --set name=OTHER", file=sys.stderr)
        return 2
    if args.detach:
        from orchestrator.run.serving.detach import start_detached

        argv = ["--config", str(args.config), "--drain-s", str(args.drain_s), "--state-dir", str(directory)]
        for override in args.overrides:
            argv += ["--set", override]
        return start_detached(argv, directory, cfg.name, args.ready_timeout_s, say=lambda line: print(line, flush=True))
    return run_serve(cfg, drain_s=args.drain_s, say=lambda line: print(line, flush=True), state_dir=directory)


def _service(args: argparse.Namespace) -> dict | None:
    from orchestrator.run.serving.control import ServiceNotFound, find_service, state_dir

    try:
        return find_service(state_dir(args.state_dir), args.name)
    except ServiceNotFound as exc:
        print(f"serve {args.serve_cmd}: {exc}", file=sys.stderr)
        return None


def _cmd_serve_status(args: argparse.Namespace) -> int:
    from orchestrator.run.serving.control import service_status

    state = _service(args)
    if state is None:
        return 1
    status = service_status(state)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    engine = "SIMULATED engine" if status["simulated"] else "SGLang"
    ready = f" (ready after {status['ready_after_s']} s)" if status["ready_after_s"] is not None else ""
    print(f"service {status['name']} (pid {state['pid']}): gateway {status['gateway']}/v1, model {status['model']}, "
          f"{engine}; up {status['uptime_s']:.0f} s{ready}; layout {status['layout']}")
    print(f"  {'worker':<16} {'role':<10} {'state':<8} {'requests':>8} {'in flight':>9}  url")
    for w in status["workers"]:
        print(f"  {w['name']:<16} {w['role']:<10} {w['state']:<8} {w['requests'] if w['requests'] is not None else '?':>8} "
              f"{w['in_flight'] if w['in_flight'] is not None else '?':>9}  {w['url']}")
    for w in status["pair_warmups"]:
        print(f"  pair warm-up {w['prefill']} -> {w['decode']}: {w['seconds'] * 1000:.0f} ms"
              + (f" FAILED ({w['error']})" if w["error"] else ""))
    for c in status["changes"]:
        print(f"  change {c['from']} -> {c['to'] or 'FAILED'}: added {[a['name'] for a in c['added']]}, removed "
              f"{[r['name'] for r in c['removed']]}" + (f" in {c['seconds']} s" if "seconds" in c else ""))
    apps = status["applications"]
    bad = {name: s for name, s in apps.items() if "RUNNING" not in s}
    print(f"  Ray Serve applications: {len(apps) - len(bad)} of {len(apps)} RUNNING"
          + (f"; not running: {bad}" if bad else ""))
    return 0


def _stream(state: dict, path: str, body: dict, timeout_s: float) -> dict:
    from orchestrator.run.serving.control import stream_control

    last: dict = {}
    for item in stream_control(state, path, body, timeout_s):
        if "line" in item:
            print(item["line"], flush=True)
        else:
            last = item
    return last


def _cmd_serve_apply(args: argparse.Namespace) -> int:
    if not args.config and not args.overrides:
        print("serve apply: give --config X.yaml (the new layout) and/or --set KEY=VALUE, e.g. "
              "--set layout.decode.0.count=2", file=sys.stderr)
        return 2
    state = _service(args)
    if state is None:
        return 1
    text = None
    if args.config:
        try:
            with open(args.config) as f:
                text = f.read()
        except OSError as exc:
            print(f"serve apply: --config {args.config}: {exc.strerror}", file=sys.stderr)
            return 2
    result = _stream(state, "/apply", {"config_yaml": text, "overrides": args.overrides}, args.timeout_s)
    return 0 if result.get("ok") else 1


def _cmd_serve_down(args: argparse.Namespace) -> int:
    import httpx

    state = _service(args)
    if state is None:
        return 1
    try:
        result = _stream(state, "/down", {}, args.timeout_s)
    except httpx.HTTPError as exc:
        from orchestrator.run.serving.control import signal_down

        print(f"serve down: the control socket did not answer ({type(exc).__name__}: {exc}); sending SIGTERM to "
              f"pid {state['pid']}", file=sys.stderr)
        return signal_down(state, args.timeout_s)
    rc = result.get("rc")
    return rc if isinstance(rc, int) else 1


SERVE_COMMANDS = {"status": _cmd_serve_status, "apply": _cmd_serve_apply, "down": _cmd_serve_down}


def register_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve: place workers and the router as bench does, warm every PD pair, keep "
                                     "the OpenAI gateway up until SIGTERM/Ctrl-C/`serve down`, then drain and tear "
                                     "down; `serve status | apply | down` for a running service")
    add_config_args(p, required=False)
    p.add_argument("--drain-s", type=float, default=30.0,
                   help="on stop (and per removed worker of `serve apply`), wait up to this long for in-flight requests")
    p.add_argument("--detach", action="store_true", help="return once ready; the service keeps running in the "
                                                         "background (its log: <state dir>/<name>.log)")
    p.add_argument("--ready-timeout-s", type=float, default=1800.0, help="--detach: give up waiting after this long")
    state_help = "where running services leave their state files and control sockets (default runs/serve, or " \
                 "$PD_ORCHESTRATOR_SERVE_DIR)"
    p.add_argument("--state-dir", help=state_help)
    p.set_defaults(func=_cmd_serve, serve_cmd=None)
    ssub = p.add_subparsers(dest="serve_cmd", required=False)
    status = ssub.add_parser("status", help="a running service: gateway, workers per role with state and request "
                                            "counts, pair warm-ups, layout changes, uptime")
    status.add_argument("--json", action="store_true", help="the same as JSON")
    apply = ssub.add_parser("apply", help="change the running service's layout (P:D counts, new groups): new "
                                          "replicas are warmed before traffic, removed ones drained first")
    add_config_args(apply, required=False, help="the new config (only layout groups may differ); default the "
                                                "running one, changed by --set")
    apply.add_argument("--timeout-s", type=float, default=3600.0)
    down = ssub.add_parser("down", help="drain in-flight requests, tear down what the service placed, report")
    down.add_argument("--timeout-s", type=float, default=3600.0)
    for q in (status, apply, down):
        q.add_argument("--name", help="the service's name (its config's name); needed when several run")
        q.add_argument("--state-dir", help=state_help)
