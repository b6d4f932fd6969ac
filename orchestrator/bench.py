"""Offline benchmark driver: preflight -> dataset -> placement -> engine start -> warm-up -> measured run -> report.

`pd-orchestrator bench --config X` (also inside `ray job submit`) and `run_bench(cfg)` for other modules.
Every phase is timed from job start; the deadline (benchmark.deadline_s) covers all of them. The batch
goes to the PD router's handle in one streamed call with admission control (max_in_flight); every
prompt ends completed or failed-with-reason. Teardown (Serve, and the local cluster if we started it)
also runs on Ctrl-C / SIGTERM, after writing the partial result with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from orchestrator.config import RunConfig
from orchestrator.ports import free_port, port_free
from orchestrator.protocol import BenchRequest, RequestResult
from orchestrator.live import LiveView
from orchestrator.metrics import BenchMetrics
from orchestrator.report import (
    PhaseTime,
    RunVerdict,
    ThroughputSummary,
    failure_reasons,
    git_sha,
    our_lines,
    redacted_config,
    redacted_env,
    result_block,
    versions,
    write_result_json,
)

log = logging.getLogger("pd_orchestrator.bench")
DEFAULT_MAX_RUNNING = 256  # per decode server, when the cost model cannot say


class BenchInterrupted(Exception):
    """Ctrl-C or SIGTERM during a run; the partial result is written with this reason."""


class BenchAborted(RuntimeError):
    """A phase failed (placement, engine start, router); the run is INVALID with this reason."""


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
    def phase(self, name: str, quiet: bool = False) -> Iterator[None]:
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
        return result_block(self.summary) + "\n" + our_lines(self.verdict)

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


def sample_batch(cfg: RunConfig, num_prompts: int) -> list[BenchRequest]:
    """The ShareGPT batch as SGLang samples it (client-side token ids, sampled output lengths)."""
    from orchestrator.dataset import sample_sharegpt
    from orchestrator.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(cfg.model.path)
    prompts = sample_sharegpt(
        tokenizer, num_prompts, cfg.benchmark.seed, cfg.benchmark.dataset_path,
        cfg.benchmark.context_len, cfg.benchmark.fixed_output_len,
    )
    return order_requests([p.to_request() for p in prompts], cfg.benchmark.ordering)


def order_requests(requests: list[BenchRequest], ordering: str) -> list[BenchRequest]:
    if ordering == "longest-first":
        return sorted(requests, key=lambda r: -(r.prompt_len + r.output_len))
    if ordering == "interleave":  # long and short alternate so prefill and decode both stay busy
        by_len = sorted(requests, key=lambda r: -(r.prompt_len + r.output_len))
        out = []
        while by_len:
            out.append(by_len.pop(0))
            if by_len:
                out.append(by_len.pop())
        return out
    return requests


def warmup_batch(cfg: RunConfig, batch_size: int) -> list[BenchRequest]:
    """Warm-up requests, indexed after the measured batch so records never collide."""
    from orchestrator.tokenizer import load_tokenizer

    policy = cfg.benchmark.warmup.policy
    if policy == "none":
        return []
    tokenizer = load_tokenizer(cfg.model.path)
    n = min(cfg.benchmark.warmup.num_prompts, cfg.benchmark.num_prompts)
    if policy == "sglang":  # bench_offline_throughput: random 256-in / 16-out prompts
        from orchestrator.dataset import sample_random_requests

        reqs = sample_random_requests(tokenizer, 256, 16, n, 1.0, cfg.benchmark.seed, cfg.benchmark.dataset_path,
                                      after_sharegpt_shuffle=True)
    else:  # batch-shaped: ShareGPT prompts from another seed, so the measured run gets no prefix-cache hits
        from orchestrator.dataset import sample_sharegpt

        reqs = [p.to_request() for p in sample_sharegpt(tokenizer, n, cfg.benchmark.seed + 1,
                                                       cfg.benchmark.dataset_path, cfg.benchmark.context_len)]
    for i, r in enumerate(reqs):
        r.index = batch_size + i
        r.output_len = min(r.output_len, cfg.benchmark.warmup.max_output_len)
    return reqs


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
            from orchestrator.sim.costmodel import cost_model_for

            per_server = cost_model_for(cfg, r, group).max_running()
        except Exception:  # cost model unavailable for this model/GPU: SGLang-like default
            per_server = group.max_running_requests or DEFAULT_MAX_RUNNING
        total += per_server * group.count
    return max(1, min(total, batch_size))


# ---- driving the router ------------------------------------------------------------------------


ABORT_GRACE_S = 2.0


def stream_batch(router, requests: list[BenchRequest], limit: int, deadline_at: float,
                 on_result: Callable[[RequestResult], None] | None = None) -> list[RequestResult]:
    """Send the batch through the router handle; every request comes back as a result, ok or failed."""
    results: dict[int, RequestResult] = {}
    error: str | None = None
    gen = None
    try:
        gen = router.options(stream=True).generate_batch.remote(requests, limit, deadline_at)
        for result in gen:
            results[result.index] = result
            if on_result is not None:
                on_result(result)
            _check_stop()
    except (KeyboardInterrupt, BenchInterrupted):
        _abort_in_flight(gen)
        raise
    except Exception as exc:  # router died mid-batch: the rest fail with its error
        if _STOP_REASON:  # a SIGTERM raised inside Ray's code comes back as another exception
            _abort_in_flight(gen)
        _check_stop()
        error = f"router stream failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return complete_results(requests, results, error or "no result from the router before the stream ended")


def _abort_in_flight(gen) -> None:
    """Cancelling the stream cancels the router's batch, whose dispatcher then sends /abort_request to
    both legs of every in-flight request; give it a moment before teardown stops Serve."""
    if gen is None:
        return
    try:
        gen.cancel()
    except Exception as exc:
        log.warning("could not cancel the router stream: %r", exc)
        return
    time.sleep(ABORT_GRACE_S)


def complete_results(requests: list[BenchRequest], got: dict[int, RequestResult], reason: str) -> list[RequestResult]:
    """One result per request in batch order; requests without one fail with `reason`."""
    return [
        got.get(r.index) or RequestResult(index=r.index, status="failed", prompt_len=r.prompt_len,
                                          output_len=r.output_len, error=reason)
        for r in requests
    ]


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


def _router_port(cfg: RunConfig) -> RunConfig:
    """On a local cluster a busy router port (another run on this box) moves to a free one."""
    if cfg.cluster.is_local and not os.environ.get("RAY_ADDRESS") and not port_free(cfg.router.host, cfg.router.port):
        port = free_port(cfg.router.host)
        print(f"router.port {cfg.router.port} is busy on {cfg.router.host}; using {port}", file=sys.stderr)
        cfg = cfg.model_copy(update={"router": cfg.router.model_copy(update={"port": port})})
    return cfg


_STOP_REASON: list[str] = []  # set by the SIGTERM handler; survives exceptions mangled inside Ray's C code


def _on_sigterm(signum, frame):
    _STOP_REASON.append(f"received {signal.Signals(signum).name}")
    raise BenchInterrupted(_STOP_REASON[-1])


def _check_stop() -> None:
    if _STOP_REASON:
        raise BenchInterrupted(_STOP_REASON[-1])


def _arm_sigterm() -> None:
    """SIGTERM (ray job stop, kill) becomes BenchInterrupted in the main thread, like Ctrl-C.

    Called again after `ray.init`, which installs its own SIGTERM handler that aborts the process.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    _STOP_REASON.clear()
    _arm_sigterm()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_metadata(cfg: RunConfig, run_id: str, endpoints: list, nodes: list) -> dict:
    from dataclasses import asdict

    return {
        "run_id": run_id,
        "config": redacted_config(cfg.model_dump(mode="json")),
        "engine": cfg.engine.kind,
        "simulated": cfg.engine.kind == "sim",
        "time_scale": cfg.engine.sim.time_scale if cfg.engine.kind == "sim" else 1.0,
        "layout": cfg.layout.describe(),
        "git_sha": git_sha(),
        "versions": versions(),
        "nodes": [asdict(n) for n in nodes],
        "workers": [asdict(e) for e in endpoints],
        "engine_logs": {e.name: f"{e.node_ip}:{e.log_path}" for e in endpoints},
        "env": redacted_env(),
        "host": socket.gethostname(),
    }


def _engine_label(cfg: RunConfig) -> str:
    if cfg.engine.kind == "sim":
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
    from orchestrator.plan.memory import require_fit

    if num_prompts is not None:
        cfg = cfg.model_copy(update={"benchmark": cfg.benchmark.model_copy(update={"num_prompts": num_prompts})})
    if result_dir is not None:
        cfg = cfg.model_copy(update={"benchmark": cfg.benchmark.model_copy(update={"result_dir": str(result_dir)})})
    run_id = run_id or f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    time_scale = cfg.engine.sim.time_scale if cfg.engine.kind == "sim" else 1.0
    clock = PhaseClock(time_scale, started_at)
    deadline_at = clock.started_at + cfg.benchmark.deadline_s * time_scale
    n = cfg.benchmark.num_prompts
    requests: list[BenchRequest] = []
    results: list[RequestResult] = []
    endpoints: list = []
    nodes: list = []
    reason: str | None = None
    duration_s = 0.0
    lgt = 0.0
    session = None
    cfg = _router_port(cfg)
    metrics = BenchMetrics(run_id, cfg.layout.describe(), cfg.benchmark.deadline_s,
                           started_at=clock.started_at, time_scale=time_scale)
    view = LiveView(cfg.benchmark.deadline_s, n, 0, quiet=quiet, metrics=metrics, time_scale=time_scale)
    clock.on_phase = view.phase

    with _signals_raise(), view:
        try:
            with clock.phase("preflight", quiet):
                require_fit(cfg, force=force)
            with clock.phase("dataset", quiet):
                requests = sample_batch(cfg, n)
                warmup = warmup_batch(cfg, len(requests))
                view.total_prompts = len(requests)
                view.total_output_tokens = sum(r.output_len for r in requests)
            with clock.phase("placement", quiet):
                session, nodes = _place(cfg, run_id, state_path, deadline_at)
                _export_driver_metrics(cfg, run_id, metrics)
            router = _router_handle()
            with clock.phase("engine start", quiet):
                endpoints = _wait_ready(router, cfg, deadline_at)
            if warmup:
                with clock.phase("warm-up", quiet):
                    warm = stream_batch(router, warmup, max_in_flight(cfg, len(warmup)), deadline_at)
                    bad = [r for r in warm if r.status != "ok"]
                    if bad and not quiet:
                        print(f"warm-up: {len(bad)}/{len(warm)} failed, first: {bad[0].error}", file=sys.stderr)
            with clock.phase("measured run", quiet):
                t = time.perf_counter()
                results = stream_batch(router, requests, max_in_flight(cfg, len(requests)), deadline_at,
                                       on_result=view.update)
                duration_s = (time.perf_counter() - t) / time_scale
            lgt = last_gen_throughput(endpoints)
        except (KeyboardInterrupt, BenchInterrupted) as exc:
            reason = f"interrupted during {clock.failed_in or 'start-up'}: {exc or 'Ctrl-C'}"
        except Exception as exc:
            from orchestrator.plan.memory import LayoutDoesNotFit

            if _STOP_REASON:  # our handler's exception raised inside Ray's C code comes back mangled
                reason = f"interrupted during {clock.failed_in or 'start-up'}: {_STOP_REASON[-1]}"
            elif isinstance(exc, LayoutDoesNotFit):
                verdict_line = exc.report.summary().splitlines()[0]
                reason = f"memory preflight: {verdict_line}; pass --force to run anyway\n{exc.report.summary()}"
            else:
                reason = f"{clock.failed_in or 'run'} failed: {type(exc).__name__}: {exc}"
            log.debug("bench failed", exc_info=True)
        finally:
            with clock.phase("report", True):
                result = _finish(cfg, run_id, clock, requests, results, endpoints, nodes, reason, duration_s, lgt)
                _write_html_report(result)
            _teardown(session)
    return result


def _export_driver_metrics(cfg: RunConfig, run_id: str, metrics: BenchMetrics) -> None:
    """Driver exporter + the run's Prometheus file_sd (engines, router, driver); an aid, never fatal."""
    from orchestrator.scrape import serve_metrics, start_scrape_targets

    try:
        start_scrape_targets(cfg.metrics.file_sd_path, run_id)
        serve_metrics(metrics.registry, "driver", run_id, cfg.metrics)
    except Exception as exc:
        log.warning("driver metrics not exported: %r", exc)


def _write_html_report(result: "BenchResult") -> None:
    from orchestrator.html_report import write_report

    if result.result_path is None:
        return
    try:
        write_report(result.result_path)
    except Exception as exc:  # the JSON result is the record; the HTML report is a view of it
        log.warning("HTML report not written: %r", exc)


def _place(cfg: RunConfig, run_id: str, state_path: Path | None, deadline_at: float):
    from deployments.app import deploy
    from orchestrator.cluster import check_nodes_fit, connect, node_inventory
    from orchestrator.registry import get_registry

    import ray

    session = connect(cfg, state_path)
    _arm_sigterm()
    try:
        nodes = node_inventory()
        check_nodes_fit(cfg, nodes)
        ray.get(get_registry().clear.remote())  # endpoints of an earlier run on this cluster are stale
        deploy(cfg, run_id, timeout_s=max(1.0, deadline_at - time.time()))
    except BaseException:
        _teardown(session)
        raise
    return session, nodes


def _router_handle():
    from ray import serve

    from deployments.app import ROUTER_APP

    return serve.get_app_handle(ROUTER_APP)


def _wait_ready(router, cfg: RunConfig, deadline_at: float) -> list:
    from deployments.app import expected_workers

    response = router.wait_ready.remote(expected_workers(cfg), max(1.0, deadline_at - time.time()))
    while True:  # short waits, so Ctrl-C / SIGTERM handlers get to run promptly
        try:
            return response.result(timeout_s=1.0)
        except TimeoutError:
            _check_stop()


def _finish(cfg, run_id, clock, requests, results, endpoints, nodes, reason, duration_s, lgt) -> BenchResult:
    if requests and len(results) != len(requests):
        got = {r.index: r for r in results}
        results = complete_results(requests, got, f"not run: {reason or 'run ended early'}")
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
    result = BenchResult(run_id, None, summary, verdict, results, run_metadata(cfg, run_id, endpoints, nodes))
    path = Path(cfg.benchmark.result_dir) / run_id / "result.json"
    result.result_path = write_result_json(path, result.to_dict())
    return result


def _scaled(r: RequestResult, scale: float) -> RequestResult:
    from dataclasses import replace

    def s(v):
        return None if v is None else v / scale

    return replace(r, ttft_s=s(r.ttft_s), e2e_s=s(r.e2e_s), kv_wait_s=s(r.kv_wait_s))


def _teardown(session) -> None:
    """Serve down, then the driver, then the local cluster if this run started it; never raises."""
    try:
        import ray
        from ray import serve

        if ray.is_initialized():
            serve.shutdown()
    except Exception as exc:
        print(f"teardown: serve.shutdown failed: {exc}", file=sys.stderr)
    if session is not None:
        try:
            session.close()
        except Exception as exc:
            print(f"teardown: cluster stop failed: {exc}", file=sys.stderr)


@contextlib.contextmanager
def serve_deployment(cfg: RunConfig, state_path: Path | None = None, timeout_s: float | None = None) -> Iterator[str]:
    """Bring the deployment up as `bench` does and yield the router's HTTP URL; tear it down after."""
    cfg = _router_port(cfg)
    deadline_at = time.time() + (timeout_s or cfg.benchmark.deadline_s)
    session, _ = _place(cfg, f"{cfg.name}-serve-{uuid.uuid4().hex[:6]}", state_path, deadline_at)
    try:
        _wait_ready(_router_handle(), cfg, deadline_at)
        yield f"http://{cfg.router.host}:{cfg.router.port}"
    finally:
        _teardown(session)


# ---- CLI ----------------------------------------------------------------------------------------


def _cmd_bench(args: argparse.Namespace) -> int:
    from orchestrator.cli import config_from_args

    started_at = time.time()
    cfg = config_from_args(args)
    if args.quiet:
        logging.getLogger("ray").setLevel(logging.WARNING)
    result = run_bench(cfg, force=args.force, quiet=args.quiet, num_prompts=args.num_prompts,
                       result_dir=args.result_dir, started_at=started_at)
    print(result.text())
    print(f"result: {result.result_path}")
    if not result.valid:
        first, *detail = (result.verdict.why_invalid() or "").splitlines()
        if detail:
            print("\n".join(detail))
        print(f"INVALID: {first}", flush=True)  # the reason is the last line of the output (and job log)
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from orchestrator.cli import add_config_args

    p = sub.add_parser("bench", help="offline benchmark: place workers, run the ShareGPT batch, print the result block")
    add_config_args(p)
    p.add_argument("--quiet", action="store_true", help="only the result block and the verdict")
    p.add_argument("--force", action="store_true", help="run even if the memory preflight says it does not fit")
    p.add_argument("--num-prompts", type=int, default=None, help="override benchmark.num_prompts")
    p.add_argument("--result-dir", default=None, help="override benchmark.result_dir (result.json goes below)")
    p.set_defaults(func=_cmd_bench)
