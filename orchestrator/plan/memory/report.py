"""What the memory preflight says: the verdicts (fits | fits-with-little-KV | does-not-fit), one group's numbers
(GroupMemory), every group's with the options that fit (MemoryReport), and the refusal `bench` raises (LayoutDoesNotFit)."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.records import Role

FITS = "fits"
LITTLE_KV = "fits-with-little-KV"
DOES_NOT_FIT = "does-not-fit"
SEVERITY = {FITS: 0, LITTLE_KV: 1, DOES_NOT_FIT: 2}

# When no batch is given: ShareGPT's mean prompt + output (SGLang's sampling, R1 tokenizer, seed 2025:
# 306 + 203 tokens per request over 1000 prompts).
DEFAULT_TOKENS_PER_REQUEST = 508
DEFAULT_PROMPT_TOKENS = 306
# Below this share of the batch's concurrent KV need, queueing dominates the run: "little KV".
LITTLE_KV_SHARE = 0.5


@dataclass
class GroupMemory:
    """One worker group's memory numbers per GPU (GB = 1e9 bytes) and its verdict."""

    role: Role
    index: int
    layout: str  # e.g. "1 x TP8"
    gpu: str
    gpu_memory_gb: float
    weights_gb: float
    weights_breakdown_gb: dict[str, float]
    static_pool_gb: float
    reserve_gb: float
    kv_gb: float
    kv_capacity_tokens: int
    kv_needed_tokens: int
    concurrency: int
    verdict: str
    reason: str

    @property
    def where(self) -> str:
        return f"layout.{self.role}.{self.index}"


@dataclass
class MemoryReport:
    """Per-group verdicts; `verdict` is the worst of them; `options` are nearby layouts that fit."""

    model: str
    quantization: str
    groups: list[GroupMemory]
    options: list[str] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)  # one line per GPU that several servers share

    @property
    def verdict(self) -> str:
        return max((g.verdict for g in self.groups), key=SEVERITY.__getitem__)

    @property
    def fits(self) -> bool:
        """False only when some group does not fit at all (little KV still runs, slowly)."""
        return self.verdict != DOES_NOT_FIT

    def table(self) -> str:
        head = (
            f"{'group':<20} {'servers':<10} {'GPU':<9} {'mem GB':>7} {'weights':>8} {'reserve':>8} "
            f"{'KV GB':>7} {'KV tokens':>10} {'needed':>9}  verdict"
        )
        rows = [head]
        for g in self.groups:
            rows.append(
                f"{g.where:<20} {g.layout:<10} {g.gpu:<9} {g.gpu_memory_gb:>7.1f} {g.weights_gb:>8.1f} "
                f"{g.reserve_gb:>8.1f} {g.kv_gb:>7.1f} {g.kv_capacity_tokens:>10,} {g.kv_needed_tokens:>9,}  "
                f"{g.verdict}"
            )
        return "\n".join(rows + self.shared)

    def summary(self) -> str:
        """The verdict with every reason, and the options when something does not fit."""
        lines = [f"memory: {self.verdict} ({self.model} {self.quantization.upper()})"]
        lines += [f"  {g.where}: {g.reason}" for g in self.groups if g.verdict != FITS]
        if self.options:
            lines.append("  layouts that fit: " + "; ".join(self.options))
        return "\n".join(lines)


class LayoutDoesNotFit(RuntimeError):
    """Raised by `require_fit`: the message is the report's summary, naming each group and the fix."""

    def __init__(self, report: MemoryReport):
        self.report = report
        super().__init__(report.summary() + "\n  (pass --force to launch anyway)")
