"""benchmarks/startup_budget_oos.py: the start-up budget against every committed real-SGLang start-up, its factors set
by the rule and split registered in benchmarks/results/2026-11-28-startup-budget-v2-predicted/."""

from __future__ import annotations

from pathlib import Path

from benchmarks import startup_budget_oos
from orchestrator.plan.closedloop.startup_budget import PREPARE_OVER_PLAN, SERVE_OVER_PLAN

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "2026-11-28-startup-budget-v2" / "output.txt"


def test_the_committed_output_is_what_the_script_prints_now(capsys):
    startup_budget_oos.main()
    assert capsys.readouterr().out == OUTPUT.read_text()


def test_the_budgets_factors_are_the_registered_rule_on_the_in_sample_rows():
    starts = startup_budget_oos.job_steps() + startup_budget_oos.engine_starts() + startup_budget_oos.r1_h200_cold()
    assert startup_budget_oos.factors(starts) == {"cold": PREPARE_OVER_PLAN, "warm": SERVE_OVER_PLAN}
    assert all(s.margin >= 0 for s in starts if s.in_sample)  # the rule covers its own rows, by construction


def test_the_split_is_the_registered_one():
    """In sample: the one-H100 jobs, lease 2's job and the back-test rows the planner's terms were set on; every other
    start-up (leases 5 and 11's jobs, the other back-test rows, the R1-shaped H200 cold starts) is out of sample."""
    steps = startup_budget_oos.job_steps()
    assert {s.what.split(", ", 1)[1] for s in steps if s.in_sample} == {
        "one H100 run 1 (calls 8, 9)", "one H100 run 2 (calls 14, 15)", "two H200 lease 2 (calls 3, 4)"}
    assert {s.what.split(", ", 1)[1] for s in steps if not s.in_sample} == {
        "two H200 lease 5 (call 4)", "two H200 lease 11 (calls 5, 6)"}
    engines = startup_budget_oos.engine_starts()
    assert engines and all(s.in_sample == (s.plan_terms == "in") for s in engines)
    assert not any(s.in_sample for s in startup_budget_oos.r1_h200_cold())
    oos = [s for s in steps + engines + startup_budget_oos.r1_h200_cold() if not s.in_sample]
    assert len(oos) == 21  # as registered


def test_a_start_up_over_its_part_has_a_negative_margin_and_is_counted_over():
    start = startup_budget_oos.Start("job step", "x", "warm", False, "", 130.0, 100.0, 300.0, "e")
    assert start.budget_s == 100.0 * SERVE_OVER_PLAN and start.margin < 0
    assert "1 start-ups, 1 over the budget" in startup_budget_oos.summary("x", [start])
