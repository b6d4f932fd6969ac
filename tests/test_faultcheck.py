"""The fault tests' shared check fails a fault that met no prompt, on a synthetic result: no cluster needed."""

from __future__ import annotations

import pytest

from orchestrator.records import RequestResult
from tests.faultcheck import assert_fault_hit_prompts, in_flight

T0 = 1_000_000.0


def run(n: int = 8, spacing_s: float = 1.0, e2e_s: float = 3.0) -> list[dict]:
    """result.json-shaped prompts: prompt i sent at T0 + i * spacing, done e2e_s later, served by decode-(i % 2)."""
    return [{"index": i, "status": "ok", "sent_at": T0 + i * spacing_s, "done_at": T0 + i * spacing_s + e2e_s,
             "e2e_s": e2e_s, "attempts": 1, "error": None, "decode_worker": f"decode-{i % 2}"} for i in range(n)]


def test_a_fault_while_prompts_are_in_flight_passes_and_names_them() -> None:
    met = assert_fault_hit_prompts(run(), T0 + 4.5)
    assert [r["index"] for r in met] == [2, 3, 4]


def test_the_same_fault_moved_to_a_moment_with_no_prompt_in_flight_fails() -> None:
    results = run()  # the last prompt is done at T0 + 10
    with pytest.raises(AssertionError, match="met no prompt in flight"):
        assert_fault_hit_prompts(results, T0 + 30.0)
    with pytest.raises(AssertionError, match="met no prompt in flight"):
        assert_fault_hit_prompts(results, T0 - 20.0, T0 - 16.0)  # a window that closed before the first send


def test_a_window_counts_prompts_that_overlap_it_and_only_on_the_faulted_path() -> None:
    results = run(n=4, spacing_s=10.0, e2e_s=2.0)  # gaps: nothing in flight between T0 + 2 and T0 + 10
    with pytest.raises(AssertionError, match="met no prompt"):
        assert_fault_hit_prompts(results, T0 + 3.0, T0 + 9.0)
    assert [r["index"] for r in assert_fault_hit_prompts(results, T0 + 3.0, T0 + 10.5)] == [1]
    with pytest.raises(AssertionError, match="met no prompt"):  # prompt 1 ran on decode-1, not the faulted decode-0
        assert_fault_hit_prompts(results, T0 + 3.0, T0 + 10.5, on_path=lambda r: r["decode_worker"] == "decode-0")


def test_a_met_prompt_must_complete_or_fail_with_the_faults_reason() -> None:
    results = run()
    results[3] |= {"status": "failed", "error": "timeout: decode leg gave no answer in 8 s"}
    assert len(assert_fault_hit_prompts(results, T0 + 4.5, reasons=["timeout", "connect"])) == 3
    with pytest.raises(AssertionError, match="neither completed nor failed with its reason"):
        assert_fault_hit_prompts(results, T0 + 4.5, reasons=["connect"])
    results[3]["error"] = None
    with pytest.raises(AssertionError, match="neither completed"):
        assert_fault_hit_prompts(results, T0 + 4.5, reasons=["timeout"])


def test_records_without_done_at_use_e2e_or_count_as_still_running() -> None:
    a = RequestResult(index=0, status="ok", prompt_len=10, output_len=4, sent_at=T0, e2e_s=2.0)
    b = RequestResult(index=1, status="failed", prompt_len=10, output_len=4, sent_at=T0, error="connect: refused")
    assert in_flight([a, b], T0 + 1.0) == [a, b]
    assert in_flight([a, b], T0 + 5.0) == [b]
