"""One evaluated config of the layout and knob search: its layout label, knob settings, memory verdict and, when it
fits, its deadline budget; the ranking key the search sorts by (search.py) and explain.py reads."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchestrator.config import RunConfig
from orchestrator.plan.deadline import AT_RISK, INVALID, VALID, DeadlineBudget
from orchestrator.plan.knobs import knob_text
from orchestrator.plan.memory.report import MemoryReport
from orchestrator.rules import RulesVerdict

# Fields the search never changes: a rules violation there is the same for every layout, so it is stated once
# (and in every written config) instead of ruling every layout out.
FIXED_FIELDS = frozenset({"cluster.gpu", "cluster.num_nodes", "cluster.gpus_per_node", "model.preset", "model.path",
                          "benchmark.dataset_path"})
_VERDICT_RANK = {VALID: 0, AT_RISK: 1, INVALID: 2}


@dataclass
class Candidate:
    """One evaluated config: its layout label, knob settings, memory verdict and, when it fits, its budget."""

    label: str
    knobs: dict[str, object]  # knob name -> value, only where it differs from the base config
    config: RunConfig
    memory: MemoryReport
    budget: DeadlineBudget | None = None
    rules: RulesVerdict | None = None
    why: str = ""  # why it beats the next one in the ranking
    equivalents: list[str] = field(default_factory=list)  # knob settings predicted identical, folded into this row

    @property
    def compliant(self) -> bool:
        """No rules, or no violation the search could avoid (FIXED_FIELDS ones are stated separately)."""
        return self.rules is None or all(v.field in FIXED_FIELDS for v in self.rules.violations)

    @property
    def writable(self) -> bool:
        return self.budget is not None and self.compliant

    @property
    def simulated(self) -> DeadlineBudget:
        """The budget of a candidate that fits (memory-pruned ones were never simulated: ValueError)."""
        if self.budget is None:
            raise ValueError(f"{self.name}: not simulated ({self.memory.verdict})")
        return self.budget

    @property
    def layout(self) -> dict:
        return self.config.layout.model_dump(mode="json", exclude_defaults=True)

    @property
    def throughput(self) -> float:
        return self.budget.run.output_throughput if self.budget else 0.0

    @property
    def run_s(self) -> float:
        return self.budget.run.duration_s if self.budget else math.inf

    @property
    def total_s(self) -> float:
        return self.budget.total_s if self.budget else math.inf

    @property
    def verdict_rank(self) -> int:
        return _VERDICT_RANK[self.budget.verdict] if self.budget else 3

    @property
    def name(self) -> str:
        return self.label + ("" if not self.knobs else " " + knob_text(self.knobs))

    def sort_key(self) -> tuple:
        """Inside the deadline first; then run time (same batch: output throughput) to 0.1 s; then the fewest
        changed knobs (a change must buy run time); then total time (start-up, warm-up)."""
        return (self.verdict_rank, round(self.run_s, 1), len(self.knobs), self.total_s)
