"""Offline benchmark driver: preflight -> dataset -> placement -> engine start -> warm-up -> measured run -> report.

`pd-orchestrator bench --config X` (also inside `ray job submit`) and `run_bench(cfg)` for other modules.
Every phase is timed from job start; the deadline (benchmark.deadline_s) covers all of them. The batch
goes to the PD router's handle in one streamed call with admission control (max_in_flight); every
prompt ends completed or failed-with-reason. Teardown (Serve, and the local cluster if we started it)
also runs on Ctrl-C / SIGTERM, after writing the partial result with the reason.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from orchestrator.config import RunConfig
from orchestrator.observe.live import LiveView
from orchestrator.observe.metrics import BenchMetrics
from orchestrator.observe.report import (
    LatencySummary,
    PhaseTime,
    RunVerdict,
    ThroughputSummary,
    failure_reasons,
    git_sha,
    our_lines,
    redacted_config,
    redacted_env,
    result_block,
    rules_lines,
    versions,
    write_result_json,
)
from orchestrator.phases import Phase
from orchestrator.records import BenchRequest, RequestResult
from orchestrator.run.deployment import Deployment, job_path, with_free_router_port
from orchestrator.run.driver import (
    BenchInterrupted,
    complete_results,
    signals_deferred,
    signals_raise,
    stop_reason,
    stream_batch,
)
from orchestrator.run.fidelity import SimFidelity, engine_pacing, fidelity, modelled_run
from orchestrator.workload.batch import sample_batch, warmup_batch

log = logging.getLogger("pd_orchestrator.bench")
DEFAULT_MAX_RUNNING = 256  # per decode server, when the cost model cannot say


class PhaseClock:
    """Phase timestamps from job start; sim runs with time_scale != 1 are reported in simulated seconds."""

    def __init__(self, time_scale: float = 1.0, started_at: float | None = None):
        self.started_at = started_at or time.time()
        self.time_scale = time_scale
        self.phases: list[PhaseTime] = []
        self.current: str | None = None
        self.failed_in: str | None = None  # the phase an exception left, kept for the reason
        self.on_phase: Callable[[str], None] | None = None  # the live view / metrics follow phases

    def now_s(self) -> float:
        return (time.time() - self.started_at) / self.time_scale

    @contextlib.contextmanager
    def phase(self, phase: Phase, quiet: bool = False) -> Iterator[None]:
        name = phase.label  # the driver's spelling, in its log and in result.json
        start = self.now_s()
        self.current = name
        if not quiet:
            print(f"[{start:8.2f}s] {name} ...", file=sys.stderr, flush=True)
        if self.on_phase is not None:
            self.on_phase(name)
        try:
            yield
        except BaseException:
            self.failed_in = self.failed_in or name
            raise
        finally:
            self.phases.append(PhaseTime(name, start, self.now_s()))
            self.current = None


@dataclass
class BenchResult:
    """Everything a run produced: the block's numbers, the verdict, per-prompt records, metadata."""

    run_id: str
    result_path: Path | None
    summary: ThroughputSummary
    verdict: RunVerdict
    results: list[RequestResult]
    metadata: dict = field(default_factory=dict)
    latency: LatencySummary | None = None  # TTFT/TPOT/KV wait/e2e percentiles; computed from results if None
    simulation: SimFidelity | None = None  # sim engine: the measured run against the cost model's run
    report_path: Path | None = None  # report.html beside result.json, once written

    def __post_init__(self) -> None:
        if self.latency is None:
            self.latency = LatencySummary.from_results(self.results)

    @property
    def valid(self) -> bool:
        return self.verdict.valid

    @property
    def duration_s(self) -> float:
        return self.summary.duration_s

    @property
    def total_s(self) -> float:
        return self.verdict.total_s

    def text(self) -> str:
        if not self.verdict.completed:  # nothing ran: no block of zeros, no empty latency rows
            return our_lines(self.verdict, None, self.metadata.get("rules"))
        text = result_block(self.summary) + "\n" + our_lines(self.verdict, self.latency, self.metadata.get("rules"))
        caches = [f"{w['name']} {w['cache_state']}" for w in self.metadata.get("workers", [])
                  if w.get("cache_state", "n/a") != "n/a"]
        if caches:  # engines with compile caches (SGLang): did each start warm? (`pd-orchestrator prepare`)
            text += "\nengine start, compile caches: " + ", ".join(caches)
        return text + ("\n" + self.simulation.line() if self.simulation else "")

    def to_dict(self) -> dict:
        return {
            "run_id": self.run_id,
            "verdict": self.verdict.verdict,
            "reason": self.verdict.why_invalid(),
            "duration_s": self.summary.duration_s,
            "total_s": self.verdict.total_s,
            "deadline_s": self.verdict.deadline_s,
            "time_unit": "simulated_s" if self.metadata.get("time_scale", 1.0) != 1.0 else "s",
            "summary": self.summary.to_dict(),
            "engine_label": self.verdict.engine,
            "latency": self.latency.to_dict() if self.latency else None,
            "simulation": self.simulation.to_dict() if self.simulation else None,
            "counts": {
                "num_prompts": self.verdict.num_prompts,
                "completed": self.verdict.completed,
                "failed": self.verdict.failed,
            },
            "failure_reasons": self.verdict.failure_reasons,
            "phases": [{"name": p.name, "start_s": p.start_s, "end_s": p.end_s, "duration_s": p.duration_s}
                       for p in self.verdict.phases],
            "metadata": self.metadata,
            "results": [r.to_dict() for r in self.results],
        }


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


def run_metadata(cfg: RunConfig, run_id: str, endpoints: list, nodes: list, started_at: float | None = None) -> dict:
    from dataclasses import asdict

    return {
        "run_id": run_id,
        "started_at": started_at,  # wall clock (time.time()) the phases' start_s/end_s count from
        "config": redacted_config(cfg.model_dump(mode="json")),
        "engine": cfg.engine.kind,
        "simulated": cfg.simulated,
        "time_scale": cfg.time_scale,
        "layout": cfg.layout.describe(),
        "git_sha": git_sha(),
        "versions": versions(),
        "nodes": [asdict(n) for n in nodes],
        "workers": [asdict(e) for e in endpoints],
        "engine_logs": {e.name: f"{e.node_ip}:{e.log_path}" for e in endpoints},
        "env": redacted_env(),
        "host": socket.gethostname(),
        "rules": _rules_verdict(cfg),
    }


def _rules_verdict(cfg: RunConfig) -> dict | None:
    """The config's verdict against its `rules` profile (None without one); a bad profile is stated, not fatal."""
    from orchestrator.rules import RulesError, verdict_for

    try:
        verdict = verdict_for(cfg)
    except RulesError as exc:
        return {"profile": cfg.rules, "verdict": "unknown", "violations": [], "error": str(exc)}
    return verdict.to_dict() if verdict else None


def _engine_label(cfg: RunConfig) -> str:
    if cfg.simulated:
        return f"sim [SIMULATED {cfg.sim_profile}, {cfg.model.name}]"
    return f"sglang ({cfg.model.name})"


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

    rules = _rules_verdict(cfg)
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
            router = deployment.router()
            with clock.phase(Phase.ENGINE_START, quiet):
                endpoints = deployment.wait_ready()
            if warmup:
                with clock.phase(Phase.WARMUP, quiet):
                    warm = stream_batch(router, warmup, max_in_flight(cfg, len(warmup)), deadline_at)
                    bad = [r for r in warm if r.status != "ok"]
                    if bad and not quiet:
                        print(f"warm-up: {len(bad)}/{len(warm)} failed, first: {bad[0].error}", file=sys.stderr)
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
                result = _finish(cfg, run_id, clock, requests, results, endpoints, nodes, reason, duration_s, lgt,
                                 model if reason is None else None, pacing)
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


def _write_html_report(result: "BenchResult") -> None:
    from orchestrator.observe.html_report import write_report

    if result.result_path is None:
        return
    try:
        result.report_path = write_report(result.result_path)
    except Exception as exc:  # the JSON result is the record; the HTML report is a view of it
        log.warning("HTML report not written: %s: %s", type(exc).__name__, exc)


def _finish(cfg, run_id, clock, requests, results, endpoints, nodes, reason, duration_s, lgt,
            model=None, pacing=None) -> BenchResult:
    if requests and len(results) != len(requests):
        got = {r.index: r for r in results}
        started = any(p.name == Phase.RUN.label for p in clock.phases)
        results = complete_results(requests, got, f"{'not finished' if started else 'not run'}: "
                                                  f"{reason or 'run ended early'}")
    if clock.time_scale != 1.0:
        results = [_scaled(r, clock.time_scale) for r in results]
    completed = sum(r.status == "ok" for r in results)
    summary = ThroughputSummary.from_results(results, duration_s, "engine", lgt)
    note = None
    if clock.time_scale != 1.0:
        note = f"(times in simulated seconds: wall / time_scale {clock.time_scale:g})"
    verdict = RunVerdict(
        engine=_engine_label(cfg),
        layout=cfg.layout.describe(),
        deadline_s=cfg.benchmark.deadline_s,
        total_s=clock.now_s(),
        phases=list(clock.phases),
        num_prompts=len(requests) or cfg.benchmark.num_prompts,
        completed=completed,
        failed=len(results) - completed if results else cfg.benchmark.num_prompts,
        reason=reason,
        time_note=note,
        failure_reasons=failure_reasons(results),
    )
    result = BenchResult(run_id, None, summary, verdict, results, run_metadata(cfg, run_id, endpoints, nodes, clock.started_at))
    result.simulation = fidelity(model, duration_s, summary.total_output_tokens,
                                 summary.total_input_tokens + summary.total_output_tokens, pacing or {})
    path = result_root(cfg.benchmark.result_dir) / run_id / "result.json"
    result.result_path = write_result_json(path, result.to_dict())
    return result


def result_root(result_dir: str | Path) -> Path:
    """Where results go (a Ray job's relative benchmark.result_dir: see deployment.job_path)."""
    return job_path(result_dir)


def _scaled(r: RequestResult, scale: float) -> RequestResult:
    from dataclasses import replace

    def s(v):
        return None if v is None else v / scale

    return replace(r, ttft_s=s(r.ttft_s), e2e_s=s(r.e2e_s), kv_wait_s=s(r.kv_wait_s))


# ---- CLI ----------------------------------------------------------------------------------------


