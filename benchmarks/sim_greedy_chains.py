"""The simulated engine against `plan` on dummy-weight decode routing: a closed loop's decode server, and what keying
requests by their prompt's last token does to a ShareGPT batch (issue 25, hsim).

    .venv/bin/python benchmarks/sim_greedy_chains.py

1. Closed loop (configs/qwen3-pd-2026.yaml, engine.kind sim; dummy weights, then its own real weights): per N, `plan`'s
   ITL p50 and the time-average decode batch of its first decode server over the window, beside the ITL the simulated
   decode server (built from the command line `serve` gives it: SimBackend -> SimEngine, paced at time_scale 0.25)
   gives that many requests decoding together: chat prompts through the model's template (different texts, one last
   token: AIPerf's requests) and the same texts without it (each its own last token).
2. ShareGPT batch on dummy weights (the embedded default configs/default.yaml, R1 W4A8, and qwen3-pd-2026 as a batch):
   of the config's sampled prompts, how many end in the same token; for a decode batch of B of them (seeded draws),
   the routing tokens the sim counts (one chain per last token) and its decode step against the planner's (each prompt
   its own chain), at context B x (mean prompt + 100).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.api.openai import ChatMessage, chat_prompt  # noqa: E402
from orchestrator.config import RunConfig, load_config  # noqa: E402
from orchestrator.config.benchmark import inter_token_latency_s  # noqa: E402
from orchestrator.engines.base import WorkerPlacement  # noqa: E402
from orchestrator.engines.sim.backend import SimBackend  # noqa: E402
from orchestrator.engines.sim.engine import SimEngine  # noqa: E402
from orchestrator.engines.sim.requests import TextCodec  # noqa: E402
from orchestrator.engines.sim.settings import add_server_args, settings_from_args  # noqa: E402
from orchestrator.engines.sim.sim_request import SimRequest  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.perfmodel.weights import decode_routing_tokens  # noqa: E402
from orchestrator.plan.closedloop.client import ClosedLoopLoad, simulate_closed_loop  # noqa: E402

CLOSED_LOOP = "configs/qwen3-pd-2026.yaml"  # the contest's layout on the simulated engine; its rule loads real weights
SHORT = ["engine.sim.time_scale=0.25", "benchmark.window_s=20", "benchmark.grace_s=10"]
DUMMY = "engine.sglang.load_format=dummy"


def planned_itl_and_batch(cfg: RunConfig, n: int) -> tuple[float, float]:
    """`plan`'s ITL p50 (s) at N clients and the time-average batch of its first decode server over the window."""
    load = ClosedLoopLoad.of(cfg, n)
    busy: dict[str, float] = defaultdict(float)

    def observe(now, server, forward, _schedule):
        if server == "decode-0-0" and forward.kind == "decode" and now < load.window_s:
            busy["s"] += forward.duration_s
            busy["request_s"] += forward.duration_s * len(forward.running)

    run = simulate_closed_loop(cfg, load, observe=observe)
    return run.itl_ms()["p50"] / 1e3, busy["request_s"] / busy["s"]


def decode_server(cfg: RunConfig) -> SimEngine:
    """The config's first decode server as `serve` starts it: the backend's command line parsed back (SimSettings)."""
    placement = WorkerPlacement(role="decode", group_index=0, replica_index=0, host="127.0.0.1",
                                advertise_host="127.0.0.1", port=30000, bootstrap_port=8998)
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    argv = SimBackend().build_launch(cfg, cfg.layout.decode[0], placement).argv
    return SimEngine(settings_from_args(parser.parse_args(argv[3:])))  # after [python, -m, module]


def chat_requests(cfg: RunConfig, count: int, same_end: bool) -> list[SimRequest]:
    """`count` requests of ~input_tokens each, tokenized as the sim's chat route does: different texts through the
    model's chat template (AIPerf's requests), or (same_end False) the same texts without it, each ending in its own
    token."""
    codec, rng = TextCodec(None, cfg.model.preset), random.Random(2026)
    words = "the of and to in is was for on that with as by at from his her an are were be this which".split()
    out = []
    for i in range(count):
        text = " ".join(rng.choice(words) for _ in range(cfg.benchmark.input_tokens - 20)) + f" token{i}"
        ids = codec.encode(chat_prompt([ChatMessage(role="user", content=text)], "chatml") if same_end else text)
        out.append(SimRequest(f"r{i}", ids, max_new_tokens=cfg.benchmark.output_tokens, ignore_eos=True))
    return out


async def simulated_itl(cfg: RunConfig, requests: list[SimRequest]) -> tuple[float, float]:
    """(paced, wall) ITL (s, model time) the decode server gives `requests` decoding together: the seconds its scheduler
    paced per decode step over its time scale (every request is in every step), and the requests' median
    (end - first token) / (OSL - 1) on the wall clock over the time scale (it can only lag the paced timeline)."""
    engine = decode_server(cfg)
    scheduler, scale = engine.scheduler, cfg.engine.sim.time_scale
    scheduler.start()
    try:
        for req in requests:  # a decode's local path: the first token is there (SGLang's fake transfer)
            scheduler.submit(req)
        await asyncio.wait_for(asyncio.gather(*(r.finished_event.wait() for r in requests)), 60)
    finally:
        await scheduler.stop()
    steps = cfg.benchmark.output_tokens - 1
    if any(len(r.output_ids) != steps + 1 for r in requests) or scheduler.decode_steps != steps:
        raise RuntimeError(f"expected {steps} decode steps in lockstep, ran {scheduler.decode_steps}")
    wall = statistics.median(itl for r in requests if r.finished_at is not None and r.first_token_at is not None
                             and (itl := inter_token_latency_s(r.first_token_at, r.finished_at, steps + 1)) is not None)
    return scheduler.modelled_busy_s / scale / steps, wall / scale


def closed_loop_table() -> None:
    print("Closed loop: plan's ITL p50 against the sim's decode server at plan's batch (ms; sim paced / wall)")
    print(f"{'weights':8} {'N':>3} {'batch':>6} {'plan ITL':>9} {'sim, one chat loop':>22} {'sim, distinct ends':>22}")
    for weights, overrides in (("dummy", [DUMMY, *SHORT]), ("real", SHORT)):
        cfg = load_config(ROOT / CLOSED_LOOP, overrides, paths_from=ROOT)
        for n in (8, 16, 32):
            planned, batch = planned_itl_and_batch(cfg, n)
            cells = []
            for same_end in (True, False):
                paced, wall = asyncio.run(simulated_itl(cfg, chat_requests(cfg, round(batch), same_end)))
                cells.append(f"{paced * 1e3:6.2f} / {wall * 1e3:6.2f} ({paced / planned - 1:+6.1%})")
            print(f"{weights:8} {n:3d} {batch:6.2f} {planned * 1e3:9.2f} {cells[0]:>22} {cells[1]:>22}")


def sharegpt_table(config: str, overrides: list[str]) -> None:
    from orchestrator.workload.batch import sample_prompts

    cfg = load_config(ROOT / config, [DUMMY, *overrides], paths_from=ROOT)
    prompts = sample_prompts(cfg, cfg.benchmark.num_prompts)
    ends = Counter(p.prompt_ids[-1] for p in prompts)
    print(f"\n{config} ({cfg.model.name}, {cfg.sim_profile}), {len(prompts)} ShareGPT prompts: {len(ends)} distinct last "
          f"tokens, the most common ends {ends.most_common(3)} ({sum(n for _, n in ends.most_common(3))} prompts)")
    model = cost_model_for(cfg, "decode", cfg.layout.decode[0])
    rng = random.Random(1)
    print(f"{'B':>5} {'routing tokens':>15} {'plan step ms':>13} {'sim step ms':>12} {'sim / plan':>10}")
    for b in (8, 32, 128, 256, 512):
        if b > len(prompts):
            continue
        draw = rng.sample(prompts, b)
        chains = [p.prompt_ids[-1] for p in draw]
        ctx = b * (round(statistics.fmean(p.prompt_len for p in draw)) + 100)
        plan_s, sim_s = model.decode_step_s(b, ctx), model.decode_step_s(b, ctx, chains)
        print(f"{b:5d} {decode_routing_tokens('dummy', chains):15d} {plan_s * 1e3:13.3f} {sim_s * 1e3:12.3f} "
              f"{sim_s / plan_s - 1:+10.2%}")


def main() -> int:
    closed_loop_table()
    sharegpt_table("configs/default.yaml", [])
    sharegpt_table(CLOSED_LOOP, ["benchmark.kind=batch", "benchmark.num_prompts=1000", "benchmark.concurrency=[8,16,32]",
                                 "benchmark.window_s=120", "benchmark.grace_s=30"])  # its closed-loop fields at their defaults
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
