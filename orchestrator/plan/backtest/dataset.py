"""The back-test dataset: benchmarks/backtest/runs.yaml read and checked at the top, and each row's batch (the request
lengths its run sent, in the order its client sent them)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from orchestrator.workload.batch import ORDERINGS, order_lengths

ROOT = Path(__file__).resolve().parents[3]
DATASET = ROOT / "benchmarks" / "backtest" / "runs.yaml"


class BacktestError(ValueError):
    """A dataset row that cannot be predicted: the message names the row and the field."""


def load_dataset(path: str | Path = DATASET) -> dict:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BacktestError(f"{path}: not a readable back-test dataset ({exc})") from None
    if not isinstance(data, dict) or "runs" not in data or "batches" not in data:
        raise BacktestError(f"{path}: needs top-level 'batches' and 'runs'")
    return data


def build_batch(spec: dict, base: Path) -> list[tuple[int, int]]:
    """The request lengths a row's batch names: `uniform` (requests x (input, output) tokens, as a calibration
    run sends them), or a committed file, optionally repeated and scaled so its input and output totals are
    the published ones (each length scaled, the rounding remainder spread)."""
    if "uniform" in spec:
        u = spec["uniform"]
        return [(int(u["input"]), int(u["output"]))] * int(u["requests"])
    lengths = [(int(p), int(o)) for p, o in json.loads((base / spec["file"]).read_text())["lengths"]]
    lengths = lengths * int(spec.get("repeat", 1))
    prompts = _scale([p for p, _ in lengths], spec.get("input_tokens"))
    outputs = _scale([o for _, o in lengths], spec.get("output_tokens"))
    return list(zip(prompts, outputs))


def sent_batch(row: dict, batches: dict, base: Path) -> list[tuple[int, int]]:
    """The row's batch in the order its run's client sent it (`ordering`, through bench's own order_requests; batch
    files hold sample order). Required wherever the order can matter: a batch of one request shape has one order."""
    batch, ordering = build_batch(batches[row["batch"]], base), row.get("ordering")
    if ordering is None and len(set(batch)) == 1:
        return batch
    if ordering not in ORDERINGS:
        raise BacktestError(f"row {row.get('id')!r}: ordering must be one of {', '.join(ORDERINGS)} (the order its "
                            f"run's client sent the batch in: result.json's benchmark.ordering / sent_at, or the "
                            f"published tool's), got {ordering!r}")
    return order_lengths(batch, ordering)


def _scale(values: list[int], total: int | None) -> list[int]:
    if total is None:
        return values
    factor = total / sum(values)
    scaled = [max(1, round(v * factor)) for v in values]
    remainder = total - sum(scaled)
    step = 1 if remainder > 0 else -1
    i = 0
    while remainder:
        j = i % len(scaled)
        if scaled[j] + step >= 1:
            scaled[j] += step
            remainder -= step
        i += 1
    return scaled
