"""A/B of layouts: the same sampled batch on each config, simulated (virtual time) or real, in one table.

configs -> one batch (the first config's benchmark section) -> per config: memory preflight + deadline
budget (simulate.py), or a measuring function (the CLI's --real passes the bench) -> CompareRow (throughput, duration,
TTFT/e2e p50/p99, start-up, deadline verdict, ratio to the first). Where a real run of the same layout
exists (result.json under benchmark.result_dir, or --real), predicted and measured rows sit side by side
with the error of the prediction (predicted / measured - 1).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orchestrator.config import RunConfig
from orchestrator.plan.deadline import predict_deadline
from orchestrator.plan.memory.preflight import check_layout_fits
from orchestrator.plan.simulation.simulate import LABEL, SimulationError
from orchestrator.stats import percentile

MEASURED = "measured"  # a bench run on SGLang: GPUs measured
SIM_ENGINE = "sim-engine"  # a bench run on the simulated engine: the simulator's wall time, no GPU measured


@dataclass
class CompareRow:
    """One line of the A/B table; `source` says whether its numbers are simulated or measured."""

    name: str
    layout: str
    gpu: str
    source: str  # "simulated" (the planner) | "sim-engine" (bench on the sim engine) | "measured" (bench on SGLang)
    memory: str
    output_throughput: float = math.nan
    duration_s: float = math.nan
    ttft_p50_s: float = math.nan
    ttft_p99_s: float = math.nan
    e2e_p50_s: float = math.nan
    e2e_p99_s: float = math.nan
    startup_s: float = math.nan
    total_s: float = math.nan
    verdict: str = "-"
    ratio: float = math.nan
    error: float | None = None  # measured vs this config's simulated throughput, relative
    eager_share: float | None = None  # simulated rows: the share of decode steps the prediction runs eager (its band class)
    note: str = ""


@dataclass
class Measured:
    """Numbers of a real run, from its per-prompt records (RequestResult fields)."""

    output_tokens: int
    duration_s: float
    ttft_s: list[float]
    e2e_s: list[float]
    startup_s: float = math.nan
    total_s: float = math.nan
    verdict: str = "-"
    host_lost_s: float | None = None  # a sim-engine run that fell behind its cost model: engine steps a busy host lost

    def behind_model_note(self) -> str | None:
        """Why this run is no check of a prediction, when it is a sim-engine run that fell behind its cost model (its
        wall time is the busy host's; the back-test's band is of GPU runs); None when it is one."""
        if self.host_lost_s is None:
            return None
        return (f"fell behind the cost model (its host lost {self.host_lost_s:.1f} s of engine steps): its throughput "
                "and latencies are this host's, not a check of the prediction")


def measured_from_records(records: Sequence[dict], duration_s: float | None = None) -> Measured:
    """Throughput and latency of a real run from RequestResult dicts (only completed prompts count)."""
    ok = [r for r in records if r.get("status") == "ok"]
    if not ok:
        raise ValueError("the run has no completed prompts to measure")
    if not duration_s:
        duration_s = max(r["done_at"] for r in ok) - min(r["sent_at"] for r in records if r.get("sent_at"))
    return Measured(
        output_tokens=sum(int(r.get("completion_tokens") or 0) for r in ok),
        duration_s=duration_s,
        ttft_s=[r["ttft_s"] for r in ok if r.get("ttft_s") is not None],
        e2e_s=[r["e2e_s"] for r in ok if r.get("e2e_s") is not None],
    )


def measured_from_result(result: object) -> Measured:
    """A `run_bench` BenchResult, or its result.json dict, -> Measured (records, run duration, verdict)."""
    data = result.to_dict() if hasattr(result, "to_dict") else result
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise ValueError("not a bench result: expected a 'results' list of per-prompt records")
    measured = measured_from_records(data["results"], data.get("duration_s"))
    measured.total_s = float(data.get("total_s") or math.nan)
    measured.verdict = str(data.get("verdict") or "-")
    simulation = data.get("simulation")
    if isinstance(simulation, dict) and simulation.get("behind_model"):
        measured.host_lost_s = float(simulation.get("host_lost_s") or 0.0)
    return measured


def find_real_run(cfg: RunConfig) -> tuple[Path, Measured] | None:
    """The newest VALID result.json under cfg.benchmark.result_dir whose config has this layout, model, GPU and
    batch (an interrupted run, or one of another prompt count, measures another prediction)."""
    root = Path(cfg.benchmark.result_dir)
    want = _identity(cfg)
    paths = sorted(root.glob("*/result.json"), key=lambda p: p.stat().st_mtime, reverse=True) if root.is_dir() else []
    for path in paths:
        try:
            data = json.loads(path.read_text())
            if data.get("verdict") == "VALID" and _identity(RunConfig.model_validate(data["metadata"]["config"])) == want:
                return path, measured_from_result(data)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable, foreign or failed runs are not evidence
    return None


def _identity(cfg: RunConfig) -> tuple:
    """What must match for a real run to measure this config's prediction."""
    return (cfg.layout.model_dump(mode="json"), cfg.model.architecture().name, cfg.model.quantization,
            cfg.cluster.gpu, cfg.engine.kind, cfg.sim_profile if cfg.engine.kind == "sim" else None,
            cfg.benchmark.model_dump(mode="json", include=BATCH_FIELDS))


# the benchmark fields that make the batch and how it is sent (not where results go, the deadline or the warm-up)
BATCH_FIELDS = {"kind", "dataset_path", "num_prompts", "seed", "context_len", "fixed_output_len", "ordering",
                "max_in_flight", "input_tokens", "output_tokens"}


def simulated_row(
    name: str, cfg: RunConfig, batch: Sequence[tuple[int, int]], disk_gb_s: float = 2.0, jit_cached: bool = True
) -> CompareRow:
    """Memory verdict + simulated run and budget of one config on its target GPUs (cluster.gpu)."""
    gpu = cfg.cluster.gpu
    memory = check_layout_fits(cfg, batch, suggest=False)
    row = CompareRow(name, cfg.layout.describe(), gpu, LABEL, memory.verdict)
    if not memory.fits:
        row.note = "does not fit: " + "; ".join(g.reason for g in memory.groups if g.verdict == "does-not-fit")
        return row
    try:
        budget = predict_deadline(cfg, batch, gpu=gpu, disk_gb_s=disk_gb_s, jit_cached=jit_cached)
    except SimulationError as exc:
        row.note = str(exc)
        return row
    run = budget.run
    row.output_throughput = run.output_throughput
    row.eager_share = run.eager_share
    row.duration_s = run.duration_s
    row.ttft_p50_s, row.ttft_p99_s = run.ttft_p(50), run.ttft_p(99)
    row.e2e_p50_s, row.e2e_p99_s = run.e2e_p(50), run.e2e_p(99)
    row.startup_s = budget.startup_s
    row.total_s = budget.total_s
    row.verdict = budget.verdict
    return row


def measured_row(name: str, cfg: RunConfig, measured: Measured, predicted: CompareRow | None, note: str) -> CompareRow:
    row = CompareRow(
        name, cfg.layout.describe(), cfg.cluster.gpu, SIM_ENGINE if cfg.engine.kind == "sim" else MEASURED,
        predicted.memory if predicted else "-",
        output_throughput=measured.output_tokens / measured.duration_s if measured.duration_s > 0 else math.nan,
        duration_s=measured.duration_s,
        ttft_p50_s=percentile(measured.ttft_s, 50), ttft_p99_s=percentile(measured.ttft_s, 99),
        e2e_p50_s=percentile(measured.e2e_s, 50), e2e_p99_s=percentile(measured.e2e_s, 99),
        total_s=measured.total_s, verdict=measured.verdict, note=note,
    )
    if behind := measured.behind_model_note():
        row.note = f"{note}; {behind}" if note else behind
    elif predicted is not None and predicted.output_throughput > 0:
        row.error = predicted.output_throughput / row.output_throughput - 1
    return row


def compare(
    configs: Sequence[tuple[str, RunConfig]],
    batch: Sequence[tuple[int, int]],
    measure: Callable[[RunConfig], object] | None = None,
    disk_gb_s: float = 2.0,
    jit_cached: bool = True,
) -> list[CompareRow]:
    """Rows for every config: simulated, plus measured (by `measure`, or an existing run of that layout).

    `measure(cfg)` runs the config for real and returns a BenchResult or its result.json dict (the CLI
    passes the bench for --real); the planner itself never runs anything.
    """
    rows: list[CompareRow] = []
    for name, cfg in configs:
        predicted = simulated_row(name, cfg, batch, disk_gb_s, jit_cached)
        rows.append(predicted)
        if measure is not None:
            rows.append(measured_row(name, cfg, measured_from_result(measure(cfg)), predicted, "this run"))
            continue
        existing = find_real_run(cfg)
        if existing is not None:
            path, measured = existing
            rows.append(measured_row(name, cfg, measured, predicted, f"from {path}"))
    _set_ratios(rows)
    return rows


def _set_ratios(rows: list[CompareRow]) -> None:
    """Throughput ratio to the first config's row of the same source (simulated to simulated, ...)."""
    firsts: dict[str, float] = {}
    for row in rows:
        base = firsts.setdefault(row.source, row.output_throughput)
        if base and not math.isnan(base) and not math.isnan(row.output_throughput):
            row.ratio = row.output_throughput / base


def _fmt(value: float, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def compare_table(rows: Sequence[CompareRow]) -> str:
    """The A/B table; the source column labels every number simulated or measured."""
    head = (
        f"{'config':<22} {'layout':<18} {'GPU':<9} {'source':<12} {'memory':<20} {'out tok/s':>9} {'run s':>6} "
        f"{'TTFT p50':>8} {'p99':>6} {'e2e p50':>7} {'p99':>6} {'start s':>7} {'total s':>7} {'deadline':<8} "
        f"{'ratio':>5} {'pred err':>8}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r.name[:22]:<22} {r.layout[:18]:<18} {r.gpu:<9} {r.source:<12} {r.memory:<20} "
            f"{_fmt(r.output_throughput, ',.0f'):>9} {_fmt(r.duration_s, '.1f'):>6} {_fmt(r.ttft_p50_s, '.2f'):>8} "
            f"{_fmt(r.ttft_p99_s, '.2f'):>6} {_fmt(r.e2e_p50_s, '.1f'):>7} {_fmt(r.e2e_p99_s, '.1f'):>6} "
            f"{_fmt(r.startup_s, '.0f'):>7} {_fmt(r.total_s, '.0f'):>7} {r.verdict:<8} {_fmt(r.ratio, '.2f'):>5} "
            f"{_fmt(r.error, '+.0%') if r.error is not None else '':>8}"
        )
        if r.note:
            lines.append(f"{'':<22} note: {r.note}")
    return "\n".join(lines)
