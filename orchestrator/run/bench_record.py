"""A benchmark run's record: its phase clock, BenchResult, and the result.json written from how the run ended.

run.bench drives the phases; this module turns what they left (phases, prompts' results, endpoints, nodes, the reason
a run stopped) into the record: every prompt completed or failed-with-reason, times in simulated seconds for sim
runs with time_scale != 1, the run's metadata and its rules verdict.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

from orchestrator.config import RunConfig
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
    versions,
    write_result_json,
)
from orchestrator.phases import Phase
from orchestrator.records import CUT_OFF_IN_FLIGHT, NEVER_SENT, RequestResult
from orchestrator.run.deployment import PlacementStep, job_path
from orchestrator.run.driver import complete_results
from orchestrator.run.fidelity import SimFidelity, fidelity


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
        "rules": rules_verdict(cfg),
    }


def rules_verdict(cfg: RunConfig) -> dict | None:
    """The config's verdict against its `rules` profile (None without one); a bad profile is stated, not fatal."""
    from orchestrator.rules import RulesError, verdict_for

    try:
        verdict = verdict_for(cfg)
    except RulesError as exc:
        return {"profile": cfg.rules, "verdict": "unknown", "violations": [], "error": str(exc)}
    return verdict.to_dict() if verdict else None


def engine_label(cfg: RunConfig) -> str:
    if cfg.simulated:
        return f"sim [SIMULATED {cfg.sim_profile}, {cfg.model.name}]"
    return f"sglang ({cfg.model.name})"



def placement_steps(clock: PhaseClock, steps: list[PlacementStep]) -> list[dict]:
    """Placement's steps (Deployment.steps) on the phases' clock: seconds from job start (simulated seconds when
    time_scale != 1), as result.json's metadata.placement_steps."""
    def on_clock(t: float) -> float:
        return round((t - clock.started_at) / clock.time_scale, 3)

    return [{"name": s.name, "start_s": on_clock(s.start), "end_s": on_clock(s.end),
             "duration_s": round((s.end - s.start) / clock.time_scale, 3)} for s in steps]


def steps_line(clock: PhaseClock, steps: list[PlacementStep]) -> str:
    """One line of where placement's time went, e.g. "prefill raylet 5.1 s, decode raylet 3.1 s, ..."."""
    return ", ".join(f"{s['name']} {s['duration_s']:.1f} s" for s in placement_steps(clock, steps))


def record_result(cfg, run_id, clock, requests, results, endpoints, nodes, reason, duration_s, lgt,
            model=None, pacing=None, steps: list[PlacementStep] | None = None) -> BenchResult:
    if reason:  # a stopped batch's router named its unfinished prompts (in flight or never sent); add why it stopped
        results = [replace(r, error=f"{r.error}: {reason}") if r.error in (CUT_OFF_IN_FLIGHT, NEVER_SENT) else r
                   for r in results]
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
        engine=engine_label(cfg),
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
    result.metadata["placement_steps"] = placement_steps(clock, steps or [])
    result.simulation = fidelity(model, duration_s, summary.total_output_tokens,
                                 summary.total_input_tokens + summary.total_output_tokens, pacing or {})
    path = result_root(cfg.benchmark.result_dir) / run_id / "result.json"
    result.result_path = write_result_json(path, result.to_dict())
    return result


def result_root(result_dir: str | Path) -> Path:
    """Where results go (a Ray job's relative benchmark.result_dir: see deployment.job_path)."""
    return job_path(result_dir)


def _scaled(r: RequestResult, scale: float) -> RequestResult:
    def s(v):
        return None if v is None else v / scale

    return replace(r, ttft_s=s(r.ttft_s), e2e_s=s(r.e2e_s), kv_wait_s=s(r.kv_wait_s))
