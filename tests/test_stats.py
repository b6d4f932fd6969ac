"""orchestrator.stats.percentile: numpy's linear (the product's, as SGLang's bench_serving) and nearest (the router
benchmarks' recorded p50/p99) methods."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.stats import percentile


@pytest.mark.parametrize("method", ["linear", "nearest"])
def test_percentile_is_numpys_for_every_size_and_rank(method) -> None:
    rng = np.random.default_rng(2025)
    for n in (1, 2, 3, 4, 5, 10, 11, 100, 399, 400, 401):
        values = list(rng.lognormal(size=n))
        for q in (0, 1, 25, 50, 75, 90, 99, 99.9, 100):
            expected = float(np.percentile(values, q, method=method))
            if method == "nearest":  # a sample itself
                assert percentile(values, q, method) == expected, (n, q)
            else:  # numpy interpolates with another rounding of the same formula
                assert percentile(values, q, method) == pytest.approx(expected, rel=1e-12), (n, q)


def test_nearest_breaks_a_tie_to_the_even_rank_and_no_values_give_nan() -> None:
    assert percentile([1.0, 2.0], 50, "nearest") == 1.0  # rank 0.5 -> 0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50, "nearest") == 3.0  # rank 1.5 -> 2
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert math.isnan(percentile([], 50, "nearest"))
