"""Offline benchmark driver: preflight -> dataset -> placement -> engine start -> warm-up -> measured run -> report.

`pd-orchestrator bench --config X` (also inside `ray job submit`) and `run_bench(cfg)` for other modules.
Every phase is timed from job start; the deadline (benchmark.deadline_s) covers all of them. The batch
goes to the PD router's handle in one streamed call with admission control (max_in_flight); every
prompt ends completed or failed-with-reason. Teardown (Serve, and the local cluster if we started it)
also runs on Ctrl-C / SIGTERM, after writing the partial result with the reason.
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from pathlib import Path

from orchestrator.config import RunConfig
from orchestrator.observe.live import LiveView
from orchestrator.observe.metrics import BenchMetrics
from orchestrator.observe.report import rules_lines
from orchestrator.phases import Phase
from orchestrator.records import BenchRequest, RequestResult
from orchestrator.run.bench_record import BenchResult, PhaseClock, record_result, rules_verdict, steps_line
from orchestrator.run.bench_warmup import run_warmup, warmup_failures
from orchestrator.run.deployment import Deployment, with_free_router_port
from orchestrator.run.driver import BenchInterrupted, signals_deferred, signals_raise, stop_reason, stream_batch
from orchestrator.run.fidelity import engine_pacing, modelled_run
from orchestrator.workload.batch import bench_first_forwards, sample_batch, warmup_batch

log = logging.getLogger("pd_orchestrator.bench")
DEFAULT_MAX_RUNNING = 256  # per decode server, when the cost model cannot say


# ---- batch -----------------------------------------------------------------------------------


def max_in_flight(cfg: RunConfig, batch_size: int) -> int:
    """Admission limit: the configured number, or enough to fill every decode server's running batch."""
    if cfg.benchmark.max_in_flight != "auto":
        return int(cfg.benchmark.max_in_flight)
    role = "aggregated" if cfg.layout.mode == "aggregated" else "decode"
    total = 0
    for r, _, group in cfg.layout.groups():
        if r != role:
            continue
        try:
            from orchestrator.perfmodel.costmodel import cost_model_for

            per_server = cost_model_for(cfg, r, group).max_running()
        except Exception:  # cost model unavailable for this model/GPU: SGLang-like default
            per_server = group.max_running_requests or DEFAULT_MAX_RUNNING
        total += per_server * group.count
    return max(1, min(total, batch_size))


# ---- driving the router ------------------------------------------------------------------------


def last_gen_throughput(endpoints: list) -> float:
    """SGLang reads the first DP rank's last decode-window rate from /server_info; so do we (0 if absent)."""
    import httpx

    for ep in endpoints:
        if ep.role not in ("decode", "aggregated"):
            continue
        try:
            info = httpx.get(ep.url + "/server_info", timeout=30.0).json()
            return float(info["internal_states"][0]["last_gen_throughput"])
        except Exception as exc:  # no such field or no answer: the line then shows 0.00
            log.warning("last generation throughput unavailable from %s: %s", ep.url, exc)
            return 0.0
    return 0.0


# ---- the run -------------------------------------------------------------------------------------


def run_bench(
    cfg: RunConfig,
    *,
    force: bool = False,
    quiet: bool = False,
    num_prompts: int | None = None,
    result_dir: str | Path | None = None,
    state_path: Path | None = None,
    run_id: str | None = None,
    started_at: float | None = None,
) -> BenchResult:
    """Run the whole benchmark; always returns a result (INVALID with a reason when a phase failed)."""
    from orchestrator.cluster.inventory import check_declared_placement
    from orchestrator.plan.memory.preflight import require_fit

    if num_prompts is not None:
        cfg = cfg.model_copy(update={"benchmark": cfg.benchmark.model_copy(update={"num_prompts": num_prompts})})
    if result_dir is not None:
        cfg = cfg.model_copy(update={"benchmark": cfg.benchmark.model_copy(update={"result_dir": str(result_dir)})})
    run_id = run_id or f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    time_scale = cfg.time_scale
    clock = PhaseClock(time_scale, started_at)
    deadline_at = clock.started_at + cfg.benchmark.deadline_s * time_scale
    n = cfg.benchmark.num_prompts
    requests: list[BenchRequest] = []
    results: list[RequestResult] = []
    finished: dict[int, RequestResult] = {}  # the measured run's results as they arrive (kept on interrupt)
    endpoints: list = []
    nodes: list = []
    reason: str | None = None
    duration_s = 0.0
    lgt = 0.0
    model = None  # sim engine: the cost model's run of this batch
    pacing: dict = {}
    cfg = with_free_router_port(cfg)
    deployment = Deployment(cfg, run_id, deadline_at, state_path)
    metrics = BenchMetrics(run_id, cfg.layout.describe(), cfg.benchmark.deadline_s,
                           started_at=clock.started_at, time_scale=time_scale)
    view = LiveView(cfg.benchmark.deadline_s, n, 0, quiet=quiet, metrics=metrics, time_scale=time_scale)
    clock.on_phase = view.phase

    rules = rules_verdict(cfg)
    if rules is not None and not quiet:  # stated before anything starts (and in the report); never refuses a run
        print("\n".join(rules_lines(rules)), file=sys.stderr, flush=True)
    with signals_raise(), view:
        try:
            with clock.phase(Phase.PREFLIGHT, quiet):
                if cfg.cluster.is_local:  # its nodes are known before it starts; a cluster's are read at placement
                    check_declared_placement(cfg)
                require_fit(cfg, force=force)
            with clock.phase(Phase.DATASET, quiet):
                requests = sample_batch(cfg, n)
                warmup = warmup_batch(cfg, len(requests))
                view.total_prompts = len(requests)
                view.total_output_tokens = sum(r.output_len for r in requests)
                model = modelled_run(cfg, [(r.prompt_len, r.output_len) for r in requests],
                                     max_in_flight(cfg, len(requests)))
            with clock.phase(Phase.PLACEMENT, quiet):
                nodes = deployment.place()
                _export_driver_metrics(cfg, run_id, metrics)
            if not quiet:
                print(f"{'':12}placement: {steps_line(clock, deployment.steps)}", file=sys.stderr, flush=True)
            router = deployment.router()
            with clock.phase(Phase.ENGINE_START, quiet):
                endpoints = deployment.wait_ready()
            if warmup:
                with clock.phase(Phase.WARMUP, quiet):
                    first, warm = run_warmup(cfg, router, endpoints, warmup, max_in_flight(cfg, len(warmup)),
                                             deadline_at, bool(bench_first_forwards(cfg)))
                    if (failed := warmup_failures(first, warm)) and not quiet:
                        print(f"warm-up: {failed}", file=sys.stderr)
            with clock.phase(Phase.RUN, quiet):
                t = time.perf_counter()
                try:
                    results = stream_batch(router, requests, max_in_flight(cfg, len(requests)), deadline_at,
                                           on_result=view.update, got=finished)
                finally:  # an interrupted run's throughput is over the time it ran
                    duration_s = (time.perf_counter() - t) / time_scale
            lgt = last_gen_throughput(endpoints)
            if model is not None:
                pacing = engine_pacing(endpoints)
        except (KeyboardInterrupt, BenchInterrupted):
            reason = _interrupted(clock, finished, quiet)
            results = list(finished.values())
        except Exception as exc:
            from orchestrator.plan.memory.report import LayoutDoesNotFit

            if stop_reason():  # our handler's exception raised inside Ray's C code comes back mangled
                reason = _interrupted(clock, finished, quiet)
                results = list(finished.values())
            elif isinstance(exc, LayoutDoesNotFit):
                verdict_line = exc.report.summary().splitlines()[0]
                reason = f"memory preflight: {verdict_line}; pass --force to run anyway\n{exc.report.summary()}"
            else:
                reason = f"{clock.failed_in or 'run'} failed: {type(exc).__name__}: {exc}"
            log.debug("bench failed", exc_info=True)
        finally:
            with signals_deferred(), clock.phase(Phase.REPORT, True):
                result = record_result(cfg, run_id, clock, requests, results, endpoints, nodes, reason, duration_s,
                                       lgt, model if reason is None else None, pacing, deployment.steps)
                _write_html_report(result)
            deployment.close()
    return result


def _interrupted(clock: PhaseClock, finished: dict, quiet: bool) -> str:
    """The reason of a run stopped by a signal (KeyboardInterrupt: someone else's SIGINT handler raised)."""
    reason = f"interrupted during {clock.failed_in or 'start-up'}: {stop_reason() or 'received SIGINT'}"
    if not quiet:
        print(f"{reason}; writing the result ({len(finished)} prompts finished)", file=sys.stderr, flush=True)
    return reason


def _export_driver_metrics(cfg: RunConfig, run_id: str, metrics: BenchMetrics) -> None:
    """The driver's exporter, listed in the run's Prometheus file_sd (Deployment.place started it); an aid."""
    from orchestrator.observe.file_sd import serve_metrics

    try:
        serve_metrics(metrics.registry, "driver", run_id, cfg.metrics)
    except Exception as exc:
        log.warning("driver metrics not exported: %r", exc)


def _write_html_report(result: BenchResult) -> None:
    from orchestrator.observe.html_report import write_report

    if result.result_path is None:
        return
    try:
        result.report_path = write_report(result.result_path)
    except Exception as exc:  # the JSON result is the record; the HTML report is a view of it
        log.warning("HTML report not written: %s: %s", type(exc).__name__, exc)


# ---- CLI ----------------------------------------------------------------------------------------


