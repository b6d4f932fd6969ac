"""The planner's prediction of each back-test row: a throughput row simulated (simulate_run), a start-up row from
engine_start_s, a memory row from the activation-headroom check; then the derived rows (the PD / aggregated ratio and
each knob's direction) from pairs of rows."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from orchestrator.config import RunConfig, load_config
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.server.activations import ACTIVATION_HEADROOM
from orchestrator.plan.backtest.dataset import DATASET, ROOT, BacktestError, load_dataset, sent_batch
from orchestrator.plan.backtest.rows import BacktestRow, honesty_fields, throughput_scope
from orchestrator.plan.deadline import engine_start_s
from orchestrator.plan.simulation.simulate import simulate_run


def _config(row: dict) -> RunConfig:
    """The row's config and overrides; the repository's configs name model folders from the repository root."""
    try:
        return load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
    except KeyError:
        raise BacktestError(f"row {row.get('id')!r}: needs 'config' (a run config path)") from None


def _measured_number(value: float | str | list[float]) -> float:
    """A runs.yaml measurement: a number, or several runs' numbers (their mean)."""
    return statistics.mean(value) if isinstance(value, list) else float(value)


def predict_row(row: dict, batches: dict, base: Path) -> BacktestRow:
    kind = row["kind"]
    version = row.get("sglang_version")
    cfg = _config(row)
    miss = row.get("miss") or {}
    if "bound" in miss:
        raise BacktestError(f"row {row['id']!r}: miss.bound widens the bound after the fact; use expect: miss")
    common = dict(
        id=row["id"], kind=kind, source=row["source"], conditions=row.get("conditions", ""),
        bound=row.get("bound"), evidence=row.get("evidence", ""), miss_why=miss.get("why", ""), **honesty_fields(row),
    )
    measured = row["measured"]
    if kind == "throughput":
        common["scope"] = throughput_scope(row)
        batch = sent_batch(row, batches, base)
        # every recorded run had the whole batch in flight (bench: 1000 of 1000; published: 2000 at once)
        run = simulate_run(cfg, batch, max_concurrency=None, sglang_version=version)
        total = measured["input_tokens"] + measured["output_tokens"]
        batch_total = sum(p + o for p, o in batch)
        note = "" if batch_total == total else f" (batch {batch_total:,} tokens vs run {total:,}: per-token rate)"
        return BacktestRow(
            **common, measured=float(measured["total_tok_s"]), predicted=run.total_throughput, unit="total tok/s",
            detail=f"run {run.duration_s:.1f} s vs {measured['duration_s']:.1f} s{note}", eager_share=run.eager_share,
        )
    if kind == "startup":
        warm = row["caches"] == "warm"
        slowest, per_group, detail = engine_start_s(cfg, jit_cached=warm, sglang_version=version)
        key = "engine_start_s" if "engine_start_s" in measured else "ready_s"
        value = measured[key]
        shown = f"{min(value):.0f}-{max(value):.0f} s" if isinstance(value, list) else f"{value:.0f} s"
        return BacktestRow(
            **common, measured=_measured_number(value), predicted=slowest, unit=f"s ({row['caches']})",
            detail=f"measured {shown}; {detail}",
        )
    if kind == "memory":
        running = int(row.get("running", cfg.benchmark.num_prompts))
        groups = [(r, g) for r, _, g in cfg.layout.groups() if r == row.get("role", r)]
        if not groups:
            raise BacktestError(f"row {row['id']!r}: role {row.get('role')!r} is not in {row['config']}")
        role, group = groups[0]
        model = cost_model_for(cfg, role, group, sglang_version=version)
        ok = model.activation_headroom_ok(running)
        # GiB throughout: free_after_init_gb is SGLang's logged "available_gpu_mem=... GB", which is bytes / 2**30
        free = model.free_after_start_bytes() / 2**30
        peak = model.activation_peak_bytes(running) / 2**30
        seen = measured.get("free_after_init_gb")
        seen_text = f"; measured free {seen:.1f} GiB" if seen is not None else ""
        return BacktestRow(
            **common, measured=measured["outcome"], predicted="ran" if ok else "oom", unit="outcome",
            detail=f"predicted free after start {free:.1f} GiB{seen_text}, activation peak {peak:.1f} GiB "
            f"(needs x{ACTIVATION_HEADROOM:.1f}), mem fraction {model.mem_fraction_static}",
        )
    raise BacktestError(f"row {row['id']!r}: kind {kind!r} is not throughput, startup or memory")


def derived_rows(rows: Sequence[BacktestRow], data: dict) -> list[BacktestRow]:
    """The PD / aggregated ratio and each knob's direction, from pairs of rows."""
    by_id = {r.id: r for r in rows}
    out: list[BacktestRow] = []
    for spec in data.get("derived", []):
        a, b = by_id.get(spec["numerator"]), by_id.get(spec["denominator"])
        if a is None or b is None:
            raise BacktestError(f"derived row {spec['id']!r}: rows {spec['numerator']!r} / {spec['denominator']!r} not found")
        measured = float(a.measured) / float(b.measured)
        predicted = float(a.predicted) / float(b.predicted)
        if spec["kind"] == "ratio":
            out.append(BacktestRow(
                id=spec["id"], kind="ratio", source="derived", conditions=spec.get("conditions", ""),
                measured=measured, predicted=predicted, unit="ratio", bound=spec.get("bound"),
                evidence=f"{a.id} / {b.id}", **honesty_fields(spec),
            ))
        else:
            def sign(x: float, tie: float = spec.get("tie", 0.0)) -> str:
                return "up" if x > 1 + tie else ("down" if x < 1 - tie else "flat")
            out.append(BacktestRow(
                id=spec["id"], kind="direction", source="derived", conditions=spec.get("conditions", ""),
                measured=sign(measured), predicted=sign(predicted), unit="direction", bound=None,
                evidence=f"{a.id} / {b.id}", detail=f"measured x{measured:.2f}, predicted x{predicted:.2f}",
                **honesty_fields(spec),
            ))
    return out


def run_backtest(path: str | Path = DATASET) -> list[BacktestRow]:
    """Every row of the dataset predicted, then the derived rows."""
    data = load_dataset(path)
    base = Path(path).parent
    rows = [predict_row(row, data["batches"], base) for row in data["runs"]]
    return rows + derived_rows(rows, data)
