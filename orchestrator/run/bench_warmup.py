"""bench's and prepare's warm-up: every prefilling server first runs the run's first forward alone, then the short
prompts go through the router.

endpoints -> first-forward targets (each PD prefill with a decode, each aggregated server alone; every DP rank)
  -> one long prompt per rank, straight to the server, one at a time per server, all servers at once (awaited)
  -> the short warm-up batch through the router (stream_batch). Neither enters the run's results.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass

from orchestrator.config import RunConfig
from orchestrator.records import BenchRequest, RequestResult, WorkerEndpoint
from orchestrator.workload.batch import FirstForward, first_forward_ids, first_forwards


UNCLAIMED = "not warmed: no layout group claims this server, or no decode to pair it with"


@dataclass(frozen=True)
class FirstForwardTarget:
    """One prefilling server and what its first forward must be; `decode`: the PD decode its prompts pair with."""

    server: WorkerEndpoint
    forward: FirstForward
    decode: WorkerEndpoint | None = None


@dataclass(frozen=True)
class FirstForwardWarmup:
    """How one server's first-forward prompts went: seconds for all its ranks, one after another."""

    server: str
    prompt_len: int
    ranks: int
    seconds: float
    error: str | None = None

    def line(self) -> str:
        return (f"first forward {self.server}: {self.ranks} x {self.prompt_len} tokens alone, {self.seconds:.1f} s"
                + (f" FAILED ({self.error})" if self.error else ""))


def first_forward_targets(cfg: RunConfig, endpoints: list[WorkerEndpoint]) -> tuple[list[FirstForwardTarget], list[str]]:
    """Every prefilling server the run can reach, with its group's first forward; PD prefills pair with the decodes
    in turn (by name). Also the names of prefilling servers it cannot warm (no group of the config claims the name,
    or no decode to pair with): a caller reports them."""
    from deployments.app import group_deployment_name

    plans = {f.role + "/" + str(f.group_index): f for f in first_forwards(cfg)}
    group_of = {group_deployment_name(role, i, group): f"{role}/{i}" for role, i, group in cfg.layout.groups()}
    decodes = sorted((e for e in endpoints if e.role == "decode"), key=lambda e: e.name)
    prefilling = sorted((e for e in endpoints if e.role in ("prefill", "aggregated")), key=lambda e: e.name)
    targets, unclaimed = [], []
    for k, e in enumerate(prefilling):
        group = group_of.get(e.name.rsplit("/", 1)[0])
        plan = plans.get(group) if group else None
        if not plans or (group is not None and plan is None):  # no dataset warm-up, or the group does not chunk
            continue
        if plan is None or (e.role == "prefill" and not decodes):
            unclaimed.append(e.name)
        else:
            targets.append(FirstForwardTarget(e, plan, decodes[k % len(decodes)] if e.role == "prefill" else None))
    return targets, unclaimed


async def _warm_server(client, target: FirstForwardTarget, short: list[BenchRequest], max_new_tokens: int,
                       timeout_s: float) -> FirstForwardWarmup:
    """The target's ranks one after another, each answered before the next is sent: a PD prefill's DP rank is the
    bootstrap room mod its DP size (SGLang's follow_bootstrap_room), an aggregated server's the next in its
    round robin."""
    import httpx

    from orchestrator.run.serving.warmup import generate_through

    f = target.forward
    base = random.randint(1, 2**62) * f.ranks
    started = time.monotonic()
    error = None
    try:
        for rank in range(f.ranks):
            body = {"input_ids": first_forward_ids(short, f.prompt_len, rank),
                    "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0},
                    "rid": f"pdo-warmup-first-forward-{uuid.uuid4().hex[:12]}"}
            if target.decode is None:
                await generate_through(client, None, target.server, body, timeout_s)
            else:
                await generate_through(client, target.server, target.decode, body, timeout_s, base + rank)
    except (httpx.HTTPError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    return FirstForwardWarmup(target.server.name, f.prompt_len, f.ranks, time.monotonic() - started, error)


async def _warm_all(targets: list[FirstForwardTarget], short: list[BenchRequest], max_new_tokens: int,
                    timeout_s: float) -> list[FirstForwardWarmup]:
    import httpx

    async with httpx.AsyncClient() as client:
        return list(await asyncio.gather(*(_warm_server(client, t, short, max_new_tokens, timeout_s)
                                           for t in targets)))


def warm_first_forwards(cfg: RunConfig, endpoints: list[WorkerEndpoint], short: list[BenchRequest],
                        deadline_at: float) -> list[FirstForwardWarmup]:
    """Each prefilling server runs the run's first forward (FirstForward) before any other warm-up prompt."""
    targets, unclaimed = first_forward_targets(cfg, endpoints)
    warmed = []
    if short and targets:
        timeout_s = max(1.0, deadline_at - time.time())
        warmed = asyncio.run(_warm_all(targets, short, cfg.benchmark.warmup.max_output_len, timeout_s))
    return warmed + [FirstForwardWarmup(name, 0, 0, 0.0, UNCLAIMED) for name in unclaimed]


def run_warmup(cfg: RunConfig, router, endpoints: list[WorkerEndpoint], short: list[BenchRequest], limit: int,
               deadline_at: float, first_forward: bool = True) -> tuple[list[FirstForwardWarmup], list[RequestResult]]:
    """The whole warm-up: first forwards (awaited; `first_forward` False: none), then the short prompts through the
    router."""
    from orchestrator.run.driver import stream_batch

    first = warm_first_forwards(cfg, endpoints, short, deadline_at) if first_forward else []
    return first, stream_batch(router, short, limit, deadline_at) if short else []


def warmup_failures(first: list[FirstForwardWarmup], short: list[RequestResult]) -> str | None:
    """One line naming what failed in the warm-up, or None."""
    parts = []
    if bad_first := [w for w in first if w.error]:
        parts.append(f"{len(bad_first)}/{len(first)} first forwards failed, first: {bad_first[0].server}: "
                     f"{bad_first[0].error}")
    if bad := [r for r in short if r.status != "ok"]:
        parts.append(f"{len(bad)}/{len(short)} prompts failed, first: {bad[0].error}")
    return "; ".join(parts) or None
