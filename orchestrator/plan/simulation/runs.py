"""What a simulated run returns and the batches it runs on (used by simulate.py, deadline, search,
compare and the back-test): SimulatedRun, SimulationError, synthetic_batch, batch_shapes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchestrator.config import RunConfig
from orchestrator.stats import percentile

LABEL = "simulated"


@dataclass(frozen=True)
class DecodeSteps:
    """One decoding server's decode steps in a simulated run: how many, how many ran eager (a batch past its largest
    CUDA graph, the cost model's decode_runs_eager), and its largest running batch."""

    server: str  # role-index-replica, as layout.<role>.<index>
    steps: int
    eager: int
    peak_running: int

    @property
    def group(self) -> tuple[str, int]:
        role, index, _ = self.server.rsplit("-", 2)
        return role, int(index)


@dataclass
class SimulatedRun:
    """Result of one simulated run; every number here is simulated (virtual time, cost model)."""

    layout: str
    gpu: str
    num_requests: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    ttft_s: list[float]
    e2e_s: list[float]
    completed: int
    label: str = LABEL
    retracted: int = 0  # SGLang retractions (aggregated servers whose KV pool ran out mid-decode)
    decode_steps: list[DecodeSteps] = field(default_factory=list)  # per decoding server

    @property
    def eager_share(self) -> float:
        """The share of all decode steps that ran eager (0 without decode steps)."""
        steps = sum(d.steps for d in self.decode_steps)
        return sum(d.eager for d in self.decode_steps) / steps if steps else 0.0

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def total_throughput(self) -> float:
        return (self.input_tokens + self.output_tokens) / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def request_throughput(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    def ttft_p(self, q: float) -> float:
        return percentile(self.ttft_s, q)

    def e2e_p(self, q: float) -> float:
        return percentile(self.e2e_s, q)


class SimulationError(ValueError):
    pass


def synthetic_batch(num_prompts: int, seed: int) -> list[tuple[int, int]]:
    """ShareGPT-shaped lengths without the dataset (log-normal, medians ~ ShareGPT's); for tests/fallback."""
    import random

    rng = random.Random(seed)
    batch: list[tuple[int, int]] = []
    while len(batch) < num_prompts:
        prompt = int(rng.lognormvariate(math.log(120), 1.2))
        output = int(rng.lognormvariate(math.log(150), 1.0))
        if 4 <= prompt and 4 <= output and prompt + output <= 4096:
            batch.append((prompt, output))
    return batch


def batch_shapes(cfg: RunConfig, synthetic: bool = False) -> tuple[list[tuple[int, int]], str]:
    """The benchmark batch as (prompt_len, output_len) in the order `bench` sends it (the config's
    benchmark.ordering, through bench's own order_requests), and where it came from (sharegpt | synthetic)."""
    from orchestrator.workload.batch import order_lengths, sample_prompts

    bench = cfg.benchmark
    if synthetic:
        return order_lengths(synthetic_batch(bench.num_prompts, bench.seed), bench.ordering), "synthetic"
    sampled = [(p.prompt_len, p.output_len) for p in sample_prompts(cfg, bench.num_prompts)]
    return order_lengths(sampled, bench.ordering), "sharegpt"
