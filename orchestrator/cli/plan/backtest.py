"""`plan --backtest [--closed-loop] [--markdown]`: reprint the back-test (every recorded real run predicted from its
conditions) or the closed-loop one, and exit 1 only on a regression."""

from __future__ import annotations

import sys

from orchestrator.plan.backtest.dataset import BacktestError
from orchestrator.plan.simulation.runs import SimulationError


def cmd_backtest(markdown: bool) -> int:
    from orchestrator.plan.backtest.predict import run_backtest
    from orchestrator.plan.backtest.report import backtest_table, summary

    try:
        rows = run_backtest()
    except (BacktestError, SimulationError, ValueError) as exc:
        print(f"plan --backtest: {exc}", file=sys.stderr)
        return 2
    print(backtest_table(rows, markdown=markdown))
    print("\n" + summary(rows))
    return 1 if any(r.regressed for r in rows) else 0  # a reported miss is a finding, not a failure


def cmd_closed_loop_backtest(markdown: bool) -> int:
    from orchestrator.plan.closedloop.backtest import closed_loop_backtest, closed_loop_table

    try:
        checks = closed_loop_backtest()
    except (SimulationError, ValueError) as exc:
        print(f"plan --backtest --closed-loop: {exc}", file=sys.stderr)
        return 2
    print(closed_loop_table(checks, markdown=markdown))
    return 0  # a miss against a bound set before the run is a finding, reported, not a failure
