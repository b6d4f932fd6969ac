"""Servers that share one GPU: their forwards time-slice it, each running at 1/k speed while k have one in flight.

config (a local cluster with gpu_split: off, where every raylet sees the same GPUs) -> which servers share a GPU
(shared_gpu_groups) -> one TimeSlicedGpu per shared GPU -> the simulation's forward completion times.

Why processor sharing: without MPS, kernels of two processes do not run on a GPU at the same time; the GPU switches
between their contexts in time slices, so while both have work each gets about half of it. Measured on the
Qwen3-shaped pair sharing one H100 (benchmarks/results/2026-11-26-qwen3-one-h100-ttft-breakdown/): a lone
4,000-token prefill forward took 32.5 / 38.4 ms (two runs' medians) while the decode server was idle and 68.8-69.4 ms
while it was decoding (1 to 15 requests: the same at every decode batch), x2.1 where two equal shares give x2. The
share is the mechanism's 1/k, not fitted to those forwards; the 5 % beyond it (context switches) is not modelled.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.config import RunConfig


@dataclass
class TimeSlicedGpu:
    """One physical GPU under several servers: each in-flight forward's remaining work (seconds it would take alone)
    drains at 1/k per second while k forwards are in flight. A forward's completion is valid only while its token is
    current: every start or finish on the GPU re-times the others (the caller re-schedules them)."""

    name: str
    clock_s: float = 0.0
    running: dict[str, list[float]] = field(default_factory=dict)  # server -> [remaining work s, token]
    _tokens: itertools.count = field(default_factory=itertools.count)

    def _advance(self, now_s: float) -> None:
        if self.running:
            worked = (now_s - self.clock_s) / len(self.running)
            for entry in self.running.values():
                entry[0] = max(0.0, entry[0] - worked)
        self.clock_s = now_s

    def start(self, now_s: float, server: str, work_s: float) -> None:
        self._advance(now_s)
        self.running[server] = [work_s, -1]

    def finish(self, now_s: float, server: str, token: int) -> bool:
        """True when `token` is the server's current completion (then its forward leaves the GPU); False: stale."""
        entry = self.running.get(server)
        if entry is None or entry[1] != token:
            return False
        self._advance(now_s)
        del self.running[server]
        return True

    def completions(self) -> list[tuple[str, float, int]]:
        """(server, completion time, token) of every in-flight forward at the current share, with fresh tokens."""
        k = len(self.running)
        out = []
        for server, entry in self.running.items():
            entry[1] = next(self._tokens)
            out.append((server, self.clock_s + entry[0] * k, int(entry[1])))
        return out


def shared_gpu_groups(cfg: RunConfig) -> list[list[str]]:
    """Server names (role-group-replica, as plan/simulation/simulate.py names them) on each GPU that several share. On a local
    cluster with gpu_split: off every raylet sees the machine's GPUs and Ray numbers each raylet's from 0, so the k-th
    GPU the servers of one local node take is the k-th of the other node's too (a PD pair on one GPU); servers whose
    GPUs overlap share one time-sliced unit."""
    if not (cfg.cluster.is_local and cfg.cluster.local.gpu_split == "off"):
        return []
    taken: dict[str, int] = {}
    on_gpu: dict[int, list[str]] = {}
    for role, i, group in cfg.layout.groups():
        node = cfg.node_role(role, group)
        per_server = -(-group.gpus_per_server // group.nnodes)
        for replica in range(group.count):
            first = taken.get(node, 0)
            for k in range(first, first + per_server):
                on_gpu.setdefault(k, []).append(f"{role}-{i}-{replica}")
            taken[node] = first + per_server
    groups: list[set[str]] = []
    for names in on_gpu.values():
        if len(names) < 2:
            continue
        touching = [g for g in groups if g & set(names)]
        merged = set(names).union(*touching)
        groups = [g for g in groups if not g & set(names)] + [merged]
    return [sorted(g) for g in groups]
