"""One back-test row (BacktestRow: prediction, measurement, error, within its bound) and the fields every row must
carry to be honest: in or out of sample, expected in or a reported miss, when its bound was set, what moved it out, and
what a throughput row measures (a full run or one calibration point)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache

from orchestrator.compressed import read_text
from orchestrator.plan.backtest.dataset import ROOT, BacktestError


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
    inside_since: str = ""  # expect: in after a reported miss: the model commit that brought it inside its bound
    inside_now: str = ""  # expect: miss kept although inside its bound now: why (e.g. inside by chance)
    eager_share: float | None = None  # throughput rows: the share of decode steps the prediction itself runs eager

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
    if not path.name.endswith((".json", ".json.xz")) or not path.is_file():
        return None
    try:
        raw = json.loads(read_text(path))
    except (OSError, ValueError):
        return None
    return raw.get("schema") if isinstance(raw, dict) else None


def honesty_fields(row: dict) -> dict:
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
                missed_since=missed_since(row.get("id"), row.get("missed_since"), expect == "miss"),
                **_inside_fields(row, expect))


def _inside_fields(row: dict, expect: str) -> dict:
    """A reported miss that came inside its bound: `inside_since` (a commit) + `inside_why` on a row now expect: in,
    or `miss.inside_now` (why it stays a miss) on one kept expect: miss; refused on the other mark or without the why."""
    since, why, kept = row.get("inside_since"), str(row.get("inside_why") or ""), (row.get("miss") or {}).get("inside_now")
    if (since is not None or why) and (expect != "in" or not re.fullmatch(r"[0-9a-f]{7,40}", str(since))
                                       or len(why) < 40):
        raise BacktestError(f"row {row.get('id')!r}: inside_since (the commit, 7-40 hex digits) and inside_why (why, one "
                            f"line) go together on a row marked expect: in; got {since!r} / {why[:40]!r}")
    if kept is not None and (expect != "miss" or len(str(kept)) < 40):
        raise BacktestError(f"row {row.get('id')!r}: miss.inside_now says, on a row kept expect: miss, why it stays a "
                            f"miss although inside its bound (one line)")
    return dict(inside_since=str(since or ""), inside_now=str(kept or ""))


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
