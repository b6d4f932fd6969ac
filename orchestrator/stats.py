"""Summary statistics shared by the planner's simulated runs and the measured run's report and live view."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal


def percentile(values: Sequence[float], q: float, method: Literal["linear", "nearest"] = "linear") -> float:
    """Percentile, q in [0, 100]; nan for no values. linear: interpolated (numpy's default, as SGLang's bench_serving);
    nearest: the sample nearest the rank, a tie to the even one (numpy's method="nearest"), what the router
    benchmarks (benchmarks/router_throughput.py and its users) have recorded their p50/p99 with."""
    if not values:
        return math.nan
    xs = sorted(values)
    if method == "nearest":
        return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
