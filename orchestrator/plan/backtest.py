"""Back-test: predict every recorded real run from its conditions and compare with what was measured.

benchmarks/backtest/runs.yaml (rows: conditions, config + overrides, batch, measured figures, bound)
-> per row: the planner's prediction with the shipped calibration profiles (simulate_run for throughput,
engine_start_s for start-ups, the activation-headroom check for memory outcomes) -> BacktestRow
(prediction, measurement, error, within its bound) -> table; plus derived rows: the PD / aggregated
ratio and the direction of every knob that two rows differ in. Every row is in-sample (a shipped profile
was fitted on that run) or out-of-sample, and every throughput row measures a full run (a batch through the
servers: what `plan` predicts) or one calibration point (one lone server's decode/context/prefill point of a
`pdo-calibration-raw/1` file, timed by the harness client's wall); `mape` summarises each set and class
separately and `error_band` is the out-of-sample full-run throughput error `plan` prints next to its
predictions, with the calibration points' figure beside it. Bounds are the dataset's, set before
a row was first predicted; a row outside its bound is reported (`expect: miss`), never held to a wider one.

No GPU and no dataset are needed: batches are the committed request lengths of the real runs.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from orchestrator.config import RunConfig, load_config
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.server.activations import ACTIVATION_HEADROOM
from orchestrator.plan.backtest_cache import cached
from orchestrator.plan.deadline import engine_start_s
from orchestrator.plan.simulate import simulate_run
from orchestrator.tables import table
from orchestrator.workload.batch import ORDERINGS, order_lengths

ROOT = Path(__file__).resolve().parents[2]
DATASET = ROOT / "benchmarks" / "backtest" / "runs.yaml"


class BacktestError(ValueError):
    """A dataset row that cannot be predicted: the message names the row and the field."""


@dataclass
class BacktestRow:
    id: str
    kind: str  # throughput | startup | memory | ratio | direction
    source: str  # measured | published | derived
    conditions: str
    measured: float | str
    predicted: float | str
    unit: str
    bound: float | None
    evidence: str
    detail: str = ""
    miss_why: str = ""  # for a reported miss: what the model lacks
    expect: str = "in"  # in: inside its bound when first predicted (a regression guard); miss: outside, reported
    sample: str = "out"  # in: a shipped profile was fitted on this run; out: an independent prediction
    bound_set: str = ""  # date + commit the bound was set (before the first prediction)
    missed_since: str = ""  # expect: miss only: the commit that moved it outside its bound, or FIRST_PREDICTION
    scope: str = ""  # throughput rows: run (a batch through the servers) | point (one calibration-harness point)

    @property
    def error(self) -> float | None:
        """predicted / measured - 1 for numbers; None for outcomes (see `within`)."""
        if isinstance(self.measured, (int, float)) and isinstance(self.predicted, (int, float)) and self.measured:
            return self.predicted / self.measured - 1
        return None

    @property
    def regressed(self) -> bool:
        """Was inside its bound when first predicted (expect: in) and is outside now."""
        return self.expect == "in" and self.within is False

    @property
    def within(self) -> bool | None:
        """Inside its bound (numbers) or the same outcome (memory, direction: a different one is a miss, reported
        with expect: miss or a regression with expect: in); None when not pinned."""
        if self.kind in ("memory", "direction"):
            return self.predicted == self.measured
        if self.bound is None or self.error is None:
            return None
        return abs(self.error) <= self.bound

    def error_text(self) -> str:
        if self.error is not None:
            return f"{self.error:+.1%}"
        return "same" if self.predicted == self.measured else "DIFFERS"


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


def _config(row: dict) -> RunConfig:
    """The row's config and overrides; the repository's configs name model folders from the repository root."""
    try:
        return load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
    except KeyError:
        raise BacktestError(f"row {row.get('id')!r}: needs 'config' (a run config path)") from None


def predict_row(row: dict, batches: dict, base: Path) -> BacktestRow:
    kind = row["kind"]
    version = row.get("sglang_version")
    cfg = _config(row)
    miss = row.get("miss") or {}
    if "bound" in miss:
        raise BacktestError(f"row {row['id']!r}: miss.bound widens the bound after the fact; use expect: miss")
    common = dict(
        id=row["id"], kind=kind, source=row["source"], conditions=row.get("conditions", ""),
        bound=row.get("bound"), evidence=row.get("evidence", ""), miss_why=miss.get("why", ""), **_honesty(row),
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
            detail=f"run {run.duration_s:.1f} s vs {measured['duration_s']:.1f} s{note}",
        )
    if kind == "startup":
        warm = row["caches"] == "warm"
        slowest, per_group, detail = engine_start_s(cfg, jit_cached=warm, sglang_version=version)
        key = "engine_start_s" if "engine_start_s" in measured else "ready_s"
        value = measured[key]
        shown = f"{min(value):.0f}-{max(value):.0f} s" if isinstance(value, list) else f"{value:.0f} s"
        return BacktestRow(
            **common, measured=statistics.mean(value) if isinstance(value, list) else float(value), predicted=slowest, unit=f"s ({row['caches']})",
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


CALIBRATION_SCHEMA = "pdo-calibration-raw/1"
SCOPE_NAMES = {"run": "full runs", "point": "single-server calibration points"}


def throughput_scope(row: dict) -> str:
    """What a throughput row measures, by what it is: 'point' when it names one point (`raw_point`) of a
    calibration raw file (`pdo-calibration-raw/1`: one lone server, tokens over the harness client's wall,
    stalls included), else 'run' (a batch through the servers, ours or published). A row that names a
    calibration point without a calibration file as evidence, or the reverse, is refused."""
    evidence = str(row.get("evidence", "")).split()
    calibration = bool(evidence) and _schema_of(evidence[0]) == CALIBRATION_SCHEMA
    names_point = "measure" in (row.get("raw_point") or {})
    if calibration != names_point:
        have = "a calibration raw file" if calibration else "no calibration raw file"
        raise BacktestError(f"row {row.get('id')!r}: evidence is {have} but raw_point "
                            f"{'names no' if calibration else 'names a'} calibration point (variant, measure, ...)")
    return "point" if calibration else "run"


@lru_cache(maxsize=64)
def _schema_of(evidence_path: str) -> str | None:
    path = ROOT / evidence_path
    if path.suffix != ".json" or not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return raw.get("schema") if isinstance(raw, dict) else None


def _honesty(row: dict) -> dict:
    """The row's sample (in/out), expect (in/miss) and when its bound was set; refused when missing or unknown."""
    sample, expect = row.get("sample"), row.get("expect", "in")
    if sample not in ("in", "out"):
        raise BacktestError(f"row {row.get('id')!r}: sample must be 'in' (a profile was fitted on it) or 'out', got {sample!r}")
    if expect not in ("in", "miss"):
        raise BacktestError(f"row {row.get('id')!r}: expect must be 'in' or 'miss', got {expect!r}")
    if row.get("bound") is not None and not row.get("bound_set"):
        raise BacktestError(f"row {row.get('id')!r}: a bound needs bound_set (the date and commit it was set)")
    if row.get("kind") == "memory":  # its bound is the outcome: expect says whether the first prediction matched it
        if not row.get("bound_set"):
            raise BacktestError(f"row {row.get('id')!r}: a memory row needs bound_set (the date and commit of its "
                                "first prediction, which decides expect: in or miss)")
        if expect == "miss" and len((row.get("miss") or {}).get("why", "")) < 40:
            raise BacktestError(f"row {row.get('id')!r}: a memory row with expect: miss needs miss.why (what the "
                                "model lacks)")
    return dict(sample=sample, expect=expect, bound_set=str(row.get("bound_set", "")),
                missed_since=missed_since(row.get("id"), row.get("missed_since"), expect == "miss"))


FIRST_PREDICTION = "first-prediction"  # outside its bound since its first prediction: no commit moved it out
THIS_COMMIT = "this-commit"  # the commit that writes this value moved it out (the test finds it by git blame)


def missed_since(row_id: object, value: object, missed: bool, field: str = "missed_since") -> str:
    """What put a reported miss outside its bound: the commit that moved it out (the test checks it is on main's history
    after bound_set's commit; THIS_COMMIT where that commit writes it) or FIRST_PREDICTION; refused on a miss without it
    or a non-miss with it."""
    if missed == (value is None) or (missed and value not in (FIRST_PREDICTION, THIS_COMMIT)
                                     and not re.fullmatch(r"[0-9a-f]{7,40}", str(value))):
        raise BacktestError(f"row {row_id!r}: {field} must name, for a reported miss only, the commit that moved it outside "
                            f"its bound (7-40 hex digits, or {THIS_COMMIT} in that commit) or {FIRST_PREDICTION}; "
                            f"got {value!r}")
    return str(value or "")


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
                evidence=f"{a.id} / {b.id}", **_honesty(spec),
            ))
        else:
            def sign(x: float, tie: float = spec.get("tie", 0.0)) -> str:
                return "up" if x > 1 + tie else ("down" if x < 1 - tie else "flat")
            out.append(BacktestRow(
                id=spec["id"], kind="direction", source="derived", conditions=spec.get("conditions", ""),
                measured=sign(measured), predicted=sign(predicted), unit="direction", bound=None,
                evidence=f"{a.id} / {b.id}", detail=f"measured x{measured:.2f}, predicted x{predicted:.2f}", **_honesty(spec),
            ))
    return out


def run_backtest(path: str | Path = DATASET) -> list[BacktestRow]:
    """Every row of the dataset predicted, then the derived rows."""
    data = load_dataset(path)
    base = Path(path).parent
    rows = [predict_row(row, data["batches"], base) for row in data["runs"]]
    return rows + derived_rows(rows, data)


def _fmt(value: float | str, unit: str) -> str:
    if isinstance(value, str):
        return value
    if unit.startswith("s"):
        return f"{value:.0f} s"
    if unit == "ratio":
        return f"{value:.2f}"
    return f"{value:,.0f}"


def backtest_table(rows: Sequence[BacktestRow], markdown: bool = False) -> str:
    """One line per row: id, in/out of sample, what it measures (run | point), source, measured, predicted, error,
    bound and when it was set, verdict."""
    head = ["row", "sample", "measures", "source", "measured", "predicted", "error", "bound", "bound set", "ok", "detail"]
    lines = []
    for r in rows:
        bound = f"±{r.bound:.0%}" if r.bound is not None else ("same" if r.kind in ("memory", "direction") else "-")
        ok = {True: "yes", False: "MISS", None: "-"}[r.within]
        if r.within is False and r.expect == "miss":
            ok = "MISS (reported)"
        lines.append([r.id, r.sample, r.scope or r.kind, r.source, _fmt(r.measured, r.unit), _fmt(r.predicted, r.unit), r.error_text(),
                      bound, r.bound_set.split(" (")[0], ok, r.detail])
    return table(head, lines, markdown)


SAMPLE_NAMES = {"in": "in-sample (a shipped profile was fitted on the run)", "out": "out-of-sample (never fitted on)"}


def mape(rows: Sequence[BacktestRow], sample: str, kind: str = "throughput",
         scope: str | None = None) -> tuple[float | None, int]:
    """Mean absolute percentage error of the rows of one sample ('in' | 'out') and kind (and, for throughput,
    scope: 'run' | 'point' | None for both), and how many there are."""
    errors = [abs(r.error) for r in rows if r.sample == sample and r.kind == kind and r.error is not None
              and scope in (None, r.scope)]
    return (statistics.mean(errors) if errors else None), len(errors)


def _mape_text(rows: Sequence[BacktestRow], sample: str) -> str:
    parts = []
    for kind, scope, label in (("throughput", "run", "throughput of full runs"),
                               ("throughput", "point", "throughput of single-server calibration points"),
                               ("startup", None, "start-up"), ("ratio", None, "ratios")):
        value, n = mape(rows, sample, kind, scope)
        if n:
            parts.append(f"{label} {value:.1%} over {n} row{'s' if n > 1 else ''}")
    knobs = [r for r in rows if r.sample == sample and r.kind in ("direction", "memory")]
    if knobs:
        parts.append(f"directions/outcomes {sum(1 for r in knobs if r.within)} of {len(knobs)} right")
    return f"MAPE {SAMPLE_NAMES[sample]}: " + ("; ".join(parts) if parts else "no rows")


def summary(rows: Sequence[BacktestRow]) -> str:
    """How many rows are inside their bounds, which are not (reported misses and regressions), and the MAPE
    of the in-sample and the out-of-sample rows, each on its own line."""
    pinned = [r for r in rows if r.within is not None]
    missed = [r for r in pinned if not r.within]
    text = f"back-test: {len(pinned) - len(missed)} of {len(pinned)} rows inside the bounds set before they were predicted"
    reported = [r for r in missed if not r.regressed]
    regressed = [r for r in missed if r.regressed]
    if reported:
        text += "; reported misses: " + ", ".join(f"{r.id} ({r.error_text()})" for r in reported)
    if regressed:
        text += "; REGRESSED (inside when first predicted): " + ", ".join(f"{r.id} ({r.error_text()})" for r in regressed)
    if stale := [r for r in pinned if r.within and r.expect == "miss"]:
        text += "; marked expect: miss but inside now: " + ", ".join(f"{r.id} ({r.error_text()})" for r in stale)
    if missed:
        text += " (docs/fidelity.md says why)"
    return "\n".join([text, _mape_text(rows, "in"), _mape_text(rows, "out"), POINTS_NOTE])


POINTS_NOTE = ("(full runs: a batch through the servers, what `plan` predicts; calibration points: one lone server's "
               "decode/context/prefill point, tokens over the harness client's wall, which includes stalls the planner "
               "does not claim to predict, e.g. likely first-use kernel compilation in eager mode)")


@dataclass(frozen=True)
class ErrorBand:
    """The planner's throughput error on the full runs no profile was fitted on: what a `plan` prediction is
    worth; with the out-of-sample single-server calibration points' error beside it (not part of the band)."""

    mape: float
    worst: float  # the largest signed error, by size
    rows: int
    points_mape: float | None = None
    points_worst: float | None = None
    points: int = 0

    def text(self) -> str:
        text = (f"±{self.mape:.0%} on out-of-sample runs (MAPE of {self.rows} full runs never fitted on; "
                f"worst {self.worst:+.0%})")
        if self.points:
            text += (f"; single-server calibration points: ±{self.points_mape:.0%} over {self.points} "
                     f"(worst {self.points_worst:+.0%}; the harness client's wall, not a full run)")
        return text


def error_band(path: str | Path = DATASET) -> ErrorBand | None:
    """The out-of-sample full-run throughput error band (plus the calibration points' figure), from the back-test
    as the model predicts it now (only the out-of-sample throughput rows are simulated); None when the dataset has
    no out-of-sample full run. Cached per dataset file in the process, and on disk for the same inputs
    (backtest_cache.py: the code, profiles, configs and files the rows name), since `plan` prints it every time."""
    resolved = Path(path).resolve()
    return _error_band_cached(str(resolved), resolved.stat().st_mtime_ns)


@lru_cache(maxsize=4)
def _error_band_cached(path: str, _mtime: int) -> ErrorBand | None:
    return cached("error-band", Path(path), lambda: _compute_error_band(path),
                  encode=lambda band: None if band is None else asdict(band),
                  decode=lambda value: None if value is None else ErrorBand(**value))


def _compute_error_band(path: str) -> ErrorBand | None:
    data = load_dataset(path)
    base = Path(path).parent
    rows = [predict_row(row, data["batches"], base) for row in data["runs"]
            if row.get("sample") == "out" and row.get("kind") == "throughput"]
    errors = [r.error for r in rows if r.error is not None and r.scope == "run"]
    points = [r.error for r in rows if r.error is not None and r.scope == "point"]
    if not errors:
        return None
    return ErrorBand(mape=statistics.mean(abs(e) for e in errors), worst=max(errors, key=abs), rows=len(errors),
                     points_mape=statistics.mean(abs(e) for e in points) if points else None,
                     points_worst=max(points, key=abs) if points else None, points=len(points))


def out_of_sample_models(path: str | Path = DATASET) -> set[str]:
    """Architecture names the out-of-sample full-run throughput rows were measured on (the band comes from them
    and says nothing about another model). Cached on disk as `error_band` is."""
    resolved = Path(path).resolve()
    return set(cached("out-of-sample-models", resolved, lambda: sorted(_compute_out_of_sample_models(resolved)),
                      encode=lambda names: names, decode=lambda value: [str(name) for name in value]))


def _compute_out_of_sample_models(path: Path) -> set[str]:
    data = load_dataset(path)
    return {load_config(ROOT / row["config"], paths_from=ROOT).model.architecture().name for row in data["runs"]
            if row.get("sample") == "out" and row.get("kind") == "throughput" and throughput_scope(row) == "run"}
