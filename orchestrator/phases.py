"""The bench job's phases, in order: the one spelling for the driver's log, metrics labels and the deadline budget.

preflight -> dataset -> placement -> engine start -> warm-up -> measured run -> report -> done. The value is
the metric/budget label (`engine_start`); `title` is how the driver prints it and result.json records it.
"""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    PREFLIGHT = "preflight"
    DATASET = "dataset"
    PLACEMENT = "placement"
    ENGINE_START = "engine_start"
    WARMUP = "warmup"
    RUN = "run"
    REPORT = "report"
    DONE = "done"

    @property
    def label(self) -> str:
        """The driver's spelling ('engine start', 'warm-up', 'measured run'; others as the value)."""
        return _TITLES.get(self, self.value)

    @classmethod
    def of(cls, name: str) -> "Phase":
        """The phase named by its value or its title; ValueError names every accepted spelling."""
        for phase in cls:
            if name in (phase.value, phase.label):
                return phase
        allowed = sorted({p.value for p in cls} | set(_TITLES.values()))
        raise ValueError(f"unknown bench phase {name!r}; allowed: {allowed}")


_TITLES = {Phase.ENGINE_START: "engine start", Phase.WARMUP: "warm-up", Phase.RUN: "measured run"}

# Phases before placement: short, and counted in the deadline budget's placement estimate.
BEFORE_PLACEMENT = (Phase.PREFLIGHT, Phase.DATASET)
