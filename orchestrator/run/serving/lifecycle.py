"""`serve`'s life: place (Deployment, one Serve application per replica) -> ready workers -> one real request through
every prefill-decode pair -> one ready line with the gateway URL -> serve (the control socket answers `serve status`,
`serve apply`, `serve down`) -> on SIGTERM/SIGINT or `serve down`: drain (wait until no worker runs, queues or
transfers a request; bounded) -> tear down.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from orchestrator.config import RunConfig
from orchestrator.records import WorkerEndpoint
from orchestrator.run.deployment import Deployment, with_free_router_port
from orchestrator.run.driver import BenchInterrupted, arm_signals, check_stop, stop_reason
from orchestrator.run.serving.changes import watch_replacements
from orchestrator.run.serving.control import ControlServer
from orchestrator.run.serving.service import Service
from orchestrator.run.serving.warmup import drain, pairs_touching, warm_pairs


def run_serve(cfg: RunConfig, drain_s: float = 30.0, say: Callable[[str], None] = print,
              state_dir: Path | None = None) -> int:
    """Place, warm every pair, print the ready line, serve until SIGTERM/SIGINT (or `serve down`), drain, tear
    down. With `state_dir`, the service answers `serve status | apply | down` on its control socket there."""
    cfg = with_free_router_port(cfg)
    service = Service(cfg, drain_s, say)
    say = service.say  # every line also goes to `serve down` / `serve apply` clients
    arm_signals()  # `serve down` during start-up stops it the same way
    control = ControlServer(service, state_dir) if state_dir is not None else None
    rc = 1
    try:
        with Deployment(cfg, service.run_id, time.time() + cfg.benchmark.deadline_s, per_replica=True) as deployment:
            service.deployment = deployment
            endpoints: list[WorkerEndpoint] = []
            try:
                deployment.place()
                endpoints = deployment.wait_ready()
                say(f"workers ready in {time.time() - service.started_at:.1f} s: "
                    + ", ".join(f"{e.name} {e.url}" for e in sorted(endpoints, key=lambda e: e.name)))
                service.warmups = asyncio.run(warm_pairs(pairs_touching(endpoints)))
                for w in service.warmups:
                    say(w.line())
                failed = [w for w in service.warmups if w.error]
                if failed:
                    say(f"serve: {len(failed)} of {len(service.warmups)} pair warm-ups failed; not serving "
                        "(see the engine logs)")
                    return rc
                service.ready_at = time.time()
                service.phase = "serving"
                threading.Thread(target=watch_replacements, args=(service,), name="replacements", daemon=True).start()
                say(f"ready: OpenAI gateway {service.gateway}/v1 (model {cfg.model.name}) after "
                    f"{service.ready_at - service.started_at:.1f} s; SIGTERM, Ctrl-C or `serve down"
                    f"{' --name ' + cfg.name if control else ''}` stops it")
                sys.stdout.flush()
                while not service.stop_requested:
                    time.sleep(0.5)
                    check_stop()
                raise BenchInterrupted(service.stop_requested)
            except (BenchInterrupted, KeyboardInterrupt, Exception) as exc:
                # our signal handler's BenchInterrupted, raised inside Ray's C code during placement or the readiness
                # wait, comes back mangled (a SystemError): still the stop it was
                if not isinstance(exc, (BenchInterrupted, KeyboardInterrupt)) and not stop_reason():
                    raise
                service.phase = "stopping"
                why = f"stopping ({stop_reason() or service.stop_requested or 'interrupted'})"
                say(f"{why}: draining in-flight requests (up to {drain_s:g} s); the gateway refuses new ones (503)")
                _ask_router(deployment, "stop_admitting", why, say)
                if service.change_lock.locked():
                    say("stopping: a layout change in progress is cut off")
                try:
                    endpoints = service.routed_endpoints() or endpoints
                except Exception as exc:  # the registry went with the cluster: drain what we knew of
                    say(f"stopping: worker registry not readable ({type(exc).__name__}); draining the workers known "
                        "at start")
                left = drain(endpoints, drain_s, say) if endpoints else 0
                if left:
                    cut = _ask_router(deployment, "cut_off_in_flight", None, say)
                    if cut is not None:
                        say(f"serve: {cut} request(s) held at the gateway answered with a 503 (a stream: an error "
                            "event, then [DONE]) and aborted on the engines")
                say("serve: tearing down the workers and the router")
                rc = 0 if not left else 3
        say("serve: stopped; workers and router torn down" + ("" if rc != 3 else
                                                               " (requests cut off by the drain timeout: see above)"))
        return rc
    finally:
        if control is not None:
            control.forget()  # before the last line reaches `serve down`: a status after it finds no service
        service.finish(rc)
        if control is not None:
            control.close()


def _ask_router(deployment: Deployment, method: str, arg: str | None, say: Callable[[str], None]):
    """Call the router replica's `method` (stopping: a router that is gone or hung only costs that step)."""
    try:
        call = getattr(deployment.router(), method)
        return (call.remote(arg) if arg is not None else call.remote()).result(timeout_s=30)
    except Exception as exc:
        say(f"stopping: the router did not answer {method} ({type(exc).__name__}); going on")
        return None
