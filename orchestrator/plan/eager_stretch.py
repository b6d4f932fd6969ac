"""What `plan` says before launch about a prediction's eager decode stretch: per decoding group, the running requests
past its largest CUDA graph, the share of its decode steps the planner's own run takes eager, why that share widens the
prediction's error, and the real flag that removes the stretch where the memory check says it fits, with the
throughput the planner predicts with it.

SimulatedRun.decode_steps (plan/simulation/simulate.py: per server, decode steps and those past the graphs) + the group's cost
model -> EagerStretch per group -> its line; the fixes are config edits (`--set layout.<role>.<i>.cuda_graph_max_bs=N`,
`...max_running_requests=N`; both at once is the search's batch_caps knob) judged by check_layout_fits, which prices
the graphs' reserve and the eager step's activations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.config import RunConfig, config_from_dict
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.plan.memory.preflight import check_layout_fits
from orchestrator.plan.simulation.runs import SimulatedRun
from orchestrator.plan.simulation.simulate import simulate_run

FIDELITY_SECTION = 'docs/fidelity.md, "The in-run eager step profiled"'


@dataclass(frozen=True)
class EagerStretch:
    """One decoding group's eager decode steps in a prediction, and the flags that keep its steps in CUDA graphs."""

    where: str  # layout.<role>.<index>
    steps: int  # decode steps of the group's servers in the prediction
    eager: int  # of them past the largest graph
    peak_running: int  # the largest running batch of one server
    per_graph: int  # that batch as one graph replay sees it (per DP-attention rank, PP micro-batch)
    graph_max_bs: int  # the group's largest decode graph (cuda_graph_max_bs as SGLang resolves it)
    graphs_fix: int | None  # cuda_graph_max_bs that graphs the peak, when the memory check says it fits
    graphs_kv: tuple[int, int] = (0, 0)  # KV tokens per server now and with graphs_fix (graphs take memory)
    cap_fix: int | None = None  # max_running_requests that keeps every step in the graphs, when it fits
    out_tok_s: tuple[float, float | None, float | None] = (0.0, None, None)  # predicted: as is, graphs_fix, cap_fix

    @property
    def share(self) -> float:
        return self.eager / self.steps if self.steps else 0.0

    def line(self) -> str:
        rank = f" ({self.per_graph} per graph replay)" if self.per_graph != self.peak_running else ""
        text = (f"{self.where}: eager decode stretch: up to {self.peak_running} running requests{rank} past its largest "
                f"CUDA graph ({self.graph_max_bs}), {self.share:.0%} of its predicted decode steps; measured eager steps "
                f"ran x1.0-2.0 the model's, by a machine mode the planner cannot see ({FIDELITY_SECTION})")
        fixes = []
        if self.graphs_fix is not None:
            now, then = self.graphs_kv
            kv = "KV unchanged" if now == then else f"KV {now:,} -> {then:,} tokens per server"
            fixes.append(f"--set {self.where}.cuda_graph_max_bs={self.graphs_fix} (memory check: fits, {kv}; "
                         f"{self._predicted(1)}; with max_running_requests={self.graphs_fix} too: the batch_caps knob)")
        if self.cap_fix is not None:
            fixes.append(f"--set {self.where}.max_running_requests={self.cap_fix} (memory check: fits; "
                         f"{self._predicted(2)}; fewer requests at once)")
        if not fixes:
            return text + "; no flag that keeps its steps in graphs passes the memory check"
        return text + ". Fix: " + " or ".join(fixes)


    def _predicted(self, which: int) -> str:
        now, fixed = self.out_tok_s[0], self.out_tok_s[which]
        return f"predicted {fixed:,.0f} vs {now:,.0f} out tok/s" if fixed else "not simulated"


def _with_group(cfg: RunConfig, role: str, index: int, **fields: object) -> RunConfig | None:
    data = cfg.model_dump(mode="json")
    data["layout"][role][index].update(fields)
    try:
        return config_from_dict(data)
    except ValueError:
        return None


def _fits(cfg: RunConfig | None, batch: Sequence[tuple[int, int]], gpu: str) -> bool:
    return cfg is not None and check_layout_fits(cfg, batch, gpu=gpu, suggest=False).fits


def eager_stretches(cfg: RunConfig, run: SimulatedRun, batch: Sequence[tuple[int, int]], gpu: str,
                    sglang_version: str | None = None) -> list[EagerStretch]:
    """The decoding groups of `run` (cfg's prediction of `batch` on `gpu`) with eager decode steps."""
    out = []
    for role, index, group in cfg.layout.groups():
        servers = [d for d in run.decode_steps if d.group == (role, index)]
        eager = sum(d.eager for d in servers)
        if not eager:
            continue
        model = cost_model_for(cfg, role, group, gpu=gpu, sglang_version=sglang_version)
        peak = max(d.peak_running for d in servers)
        requests = math.ceil(peak / max(1, model.replicas))
        per_graph = math.ceil(requests / max(1, min(model.pp, requests)) / model.attn_dp)
        graphed = _with_group(cfg, role, index, cuda_graph_max_bs=per_graph)
        after = _model(graphed, role, index, gpu, sglang_version)
        graphs_fix, graphs_kv = None, (0, 0)
        if after is not None and not after.decode_runs_eager(peak) and _fits(graphed, batch, gpu):
            graphs_fix, graphs_kv = per_graph, (model.kv_capacity_tokens(), after.kv_capacity_tokens())
        cap = model.graph_max_bs * max(1, model.pp) * model.attn_dp
        capped = _with_group(cfg, role, index, max_running_requests=cap)
        capped_model = _model(capped, role, index, gpu, sglang_version)
        cap_fix = (cap if capped_model is not None and capped_model.max_running() < peak
                   and not capped_model.decode_runs_eager(capped_model.max_running()) and _fits(capped, batch, gpu)
                   else None)
        tok_s = (run.output_throughput,
                 _out_tok_s(graphed, batch, gpu, sglang_version) if graphs_fix else None,
                 _out_tok_s(capped, batch, gpu, sglang_version) if cap_fix else None)
        out.append(EagerStretch(f"layout.{role}.{index}", sum(d.steps for d in servers), eager, peak, per_graph,
                                model.graph_max_bs, graphs_fix, graphs_kv, cap_fix, tok_s))
    return out


def _out_tok_s(cfg: RunConfig | None, batch: Sequence[tuple[int, int]], gpu: str,
               sglang_version: str | None) -> float | None:
    """The fixed config's predicted output tok/s on the same batch, as `plan` simulates it (the client as bench)."""
    return None if cfg is None else simulate_run(cfg, batch, gpu=gpu, sglang_version=sglang_version).output_throughput


def _model(cfg: RunConfig | None, role: str, index: int, gpu: str, sglang_version: str | None):
    """The cost model of group (role, index) of `cfg` (None for no config)."""
    if cfg is None:
        return None
    found, group = next((r, g) for r, i, g in cfg.layout.groups() if (r, i) == (role, index))
    return cost_model_for(cfg, found, group, gpu=gpu, sglang_version=sglang_version)
