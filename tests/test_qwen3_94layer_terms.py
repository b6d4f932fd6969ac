"""The organisers' 94-layer decode step term by term (benchmarks/qwen3_94layer_terms.py): its parts are the planner's own
step (a change to how forward.py prices a lent-floor step must show up here, not silently leave the table stale), and
the organisers' logged intervals are read as recorded."""

from __future__ import annotations

import pytest

from benchmarks import qwen3_94layer_terms as terms94


@pytest.mark.parametrize("batch", [1, 15, 64])
def test_the_parts_add_up_to_the_planners_step(batch: int) -> None:
    _, model = terms94.decode_model("H100-SXM")
    t = terms94.terms(model, batch, batch * terms94.CONTEXT_PER_REQUEST)  # asserts the sum itself
    assert t["allreduces"] == 2 * 94 and t["all-to-all"] == 0.0
    assert t["fixed per layer x L"] > 50 * t["fixed per step"]  # the 94 layers carry the fixed time, not the step
    assert t["experts hit"] == pytest.approx(128 * (1 - (1 - 8 / 128) ** batch))  # uniform routing, real weights


def test_the_logged_intervals_are_those_with_nobody_in_transfer() -> None:
    logged = terms94.logged_steps()
    assert len(logged) == 24
    assert all(13 <= batch <= 22 and 0.019 < step < 0.023 for _, batch, step in logged)
