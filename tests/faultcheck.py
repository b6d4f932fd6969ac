"""Did a fault hit prompts in flight? One check for every fault test, from the prompts' own recorded timings.

A fault test that injects its fault when no prompt is in flight on the faulted path tests nothing, and used to
pass anyway. `assert_fault_hit_prompts` takes the results (RequestResult objects, or result.json's dicts), the
wall-clock moment (or window) of the fault and which prompts ran on the faulted path, and requires:
- at least one such prompt was in flight during the fault: sent at or before its end, finished at or after
  its start (finished = done_at, else sent_at + e2e_s, else still running at the end);
- each of those ended completed, or failed with one of the fault's reasons (the error's prefix before ':').
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any


def _field(result: Any, name: str) -> Any:
    return result.get(name) if isinstance(result, dict) else getattr(result, name, None)


def sent_at(result: Any) -> float | None:
    return _field(result, "sent_at")


def finished_at(result: Any) -> float:
    """Wall clock the prompt ended; a prompt with neither done_at nor e2e_s counts as never finished."""
    done = _field(result, "done_at")
    if done is not None:
        return done
    sent, e2e = sent_at(result), _field(result, "e2e_s")
    return sent + e2e if sent is not None and e2e is not None else math.inf


def in_flight(results: Iterable[Any], start: float, end: float | None = None) -> list[Any]:
    """Prompts sent at or before `end` (default: `start`) and not finished before `start`."""
    end = start if end is None else end
    return [r for r in results if sent_at(r) is not None and sent_at(r) <= end and finished_at(r) >= start]


def assert_fault_hit_prompts(results: list[Any], fault_at: float, fault_end: float | None = None, *,
                             on_path: Callable[[Any], bool] = lambda r: True,
                             reasons: Iterable[str] = ()) -> list[Any]:
    """The prompts the fault met (each checked as the module docstring says); AssertionError if none or one
    ended otherwise. `reasons`: error prefixes that count as the fault's (empty: every one must complete)."""
    end = fault_at if fault_end is None else fault_end
    met = [r for r in in_flight(results, fault_at, end) if on_path(r)]
    if not met:
        sent = [s for s in (sent_at(r) for r in results) if s is not None]
        finished = [f for f in (finished_at(r) for r in results) if f != math.inf]
        span = (f"prompts were sent {min(sent) - fault_at:+.2f}..{max(sent) - fault_at:+.2f} s and finished by "
                f"{max(finished) - fault_at:+.2f} s relative to the fault" if sent and finished else "no timings")
        raise AssertionError(f"the fault (window {end - fault_at:.2f} s) met no prompt in flight on the faulted "
                             f"path: {span}; the test did not test anything")
    allowed = set(reasons)
    wrong = [(_field(r, "index"), _field(r, "status"), _field(r, "error")) for r in met
             if not (_field(r, "status") == "ok"
                     or (_field(r, "status") == "failed" and (_field(r, "error") or "").split(":")[0] in allowed))]
    if wrong:
        raise AssertionError(f"{len(wrong)} of the {len(met)} prompts the fault met ended neither completed nor "
                             f"failed with its reason ({sorted(allowed) or 'none allowed'}): {wrong[:10]}")
    return met


def hit_line(name: str, met: list[Any], window_s: float) -> str:
    """One printed line per fault test (`HIT ...`), which docs/reliability.md's counts are rendered from."""
    from collections import Counter

    outcomes = Counter("completed" if _field(r, "status") == "ok" else (_field(r, "error") or "").split(":")[0]
                       for r in met)
    window = "instant" if window_s == 0 else ("to the end" if window_s == math.inf else f"{window_s:.1f} s")
    shown = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
    return f"HIT {name}: window {window}, in flight on the faulted path {len(met)} ({shown})"
