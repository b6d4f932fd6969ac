"""benchmarks/startup_budget_oos.py: the start-up budget against every committed real-SGLang start-up."""

from __future__ import annotations

from pathlib import Path

from benchmarks import startup_budget, startup_budget_oos

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "2026-11-27-startup-budget-oos" / "output.txt"


def test_the_committed_output_is_what_the_script_prints_now(capsys):
    startup_budget_oos.main()
    assert capsys.readouterr().out == OUTPUT.read_text()


def test_the_in_sample_rows_are_the_factors_own_runs_and_every_other_start_is_out_of_sample():
    starts = startup_budget_oos.job_steps()
    in_sample = {(s.caches, s.measured_s) for s in starts if s.in_sample}
    ratios = startup_budget.step_ratios()
    assert in_sample == {("cold", m) for _, m, _ in ratios["prepare"]} | {("warm", m) for _, m, _ in ratios["serve"]}
    # by construction the factors cover their own runs, and only those
    assert all(s.margin >= 0 for s in starts if s.in_sample)
    others = startup_budget_oos.engine_starts() + startup_budget_oos.r1_h200_cold()
    assert others and not any(s.in_sample for s in others)


def test_a_start_up_over_its_part_has_a_negative_margin_and_is_counted_over():
    start = startup_budget_oos.Start("job step", "x", "warm", False, "", 110.0, 100.0, 300.0, "e")
    assert start.budget_s == 100.0 * startup_budget_oos.SERVE_OVER_PLAN and start.margin < 0
    assert "1 start-ups, 1 over the budget" in startup_budget_oos.summary("x", [start])
