"""A simulated `serve` + `goodput` on dummy weights decodes at the ITL `plan` predicts for the same config.

The contest's closed loop sends chat requests through one chat template: AIPerf's texts differ, every prompt ends with
the template's open assistant turn. On dummy weights such requests decode one greedy cycle of at most two tokens
(perfmodel/weights.decode_routing_tokens; docs/fidelity.md, "The closed-loop rows term by term"), so `plan` prices a
decode step of B of them as two routing tokens. The simulated engine sees token ids only: it keys each request by its
prompt's last token (sim_request.SimRequest.greedy_chain) and the step loop hands the batch's keys to the same cost
model, so its decode server must run at the planner's ITL, and requests whose prompts end differently must not.

Here: the config's decode server built as `serve` builds it (the backend's command line -> SimEngine), its scheduler
paced on the wall clock (time_scale 0.25), B requests decoding together, B the planner's time-average decode batch at
N = 16 on that server; the ITL is read from the seconds the scheduler paced (the wall clock only lags them). Tolerance 5 %: the planner's loop runs a mix of batches around B and contexts around the
lockstep batch's; the step it prices differs by < 2 % over that mix. Distinct prompts route as B tokens: > 20 % slower.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from collections import defaultdict

from orchestrator.api.openai import ChatMessage, chat_prompt
from orchestrator.config import load_config
from orchestrator.engines.base import WorkerPlacement
from orchestrator.engines.sim.backend import SimBackend
from orchestrator.engines.sim.engine import SimEngine
from orchestrator.engines.sim.requests import TextCodec
from orchestrator.engines.sim.settings import add_server_args, settings_from_args
from orchestrator.engines.sim.sim_request import SimRequest
from orchestrator.plan.closedloop.client import ClosedLoopLoad, simulate_closed_loop

CONFIG = "configs/qwen3-pd-2026.yaml"  # the contest's layout on the simulated engine; its rule loads real weights
OVERRIDES = ["engine.sglang.load_format=dummy", "engine.sim.time_scale=0.25", "benchmark.window_s=20",
             "benchmark.grace_s=10"]
N = 16
TOLERANCE = 0.05


def planned_itl_and_batch(cfg) -> tuple[float, float]:
    """`plan`'s ITL p50 (s) at N and the time-average batch of the first decode server over the window."""
    load = ClosedLoopLoad.of(cfg, N)
    busy: dict[str, float] = defaultdict(float)

    def observe(now, server, forward, _schedule):
        if server == "decode-0-0" and forward.kind == "decode" and now < load.window_s:
            busy["s"] += forward.duration_s
            busy["request_s"] += forward.duration_s * len(forward.running)

    run = simulate_closed_loop(cfg, load, observe=observe)
    return run.itl_ms()["p50"] / 1e3, busy["request_s"] / busy["s"]


def decode_server(cfg) -> SimEngine:
    group = cfg.layout.decode[0]
    placement = WorkerPlacement(role="decode", group_index=0, replica_index=0, host="127.0.0.1",
                                advertise_host="127.0.0.1", port=30000, bootstrap_port=8998)
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    argv = SimBackend().build_launch(cfg, group, placement).argv
    return SimEngine(settings_from_args(parser.parse_args(argv[3:])))  # after [python, -m, module]


def chat_requests(cfg, count: int, same_end: bool) -> list[SimRequest]:
    """`count` requests of ~input_tokens each, as the sim's chat route tokenizes them: different texts through the
    model's chat template (AIPerf's), or (same_end False) the same texts without it, each ending in its own token."""
    codec, rng = TextCodec(None, cfg.model.preset), random.Random(2026)
    words = "the of and to in is was for on that with as by at from his her an are were be this which".split()
    out = []
    for i in range(count):
        text = " ".join(rng.choice(words) for _ in range(cfg.benchmark.input_tokens - 20)) + f" token{i}"
        ids = codec.encode(chat_prompt([ChatMessage(role="user", content=text)], "chatml") if same_end else text)
        out.append(SimRequest(f"r{i}", ids, max_new_tokens=cfg.benchmark.output_tokens, ignore_eos=True))
    return out


async def simulated_itl(cfg, requests: list[SimRequest]) -> float:
    """The ITL (s) the decode server gives `requests` decoding together: the seconds its scheduler paced per decode
    step, over its time scale (every request is in every step; the wall clock can only lag the paced timeline:
    test_sim_pacing.py holds how little, checked here as no faster)."""
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
    assert all(len(r.output_ids) == steps + 1 for r in requests) and scheduler.decode_steps == steps
    paced = scheduler.modelled_busy_s / scale / steps
    wall = statistics.median((r.finished_at - r.first_token_at) / steps for r in requests) / scale
    assert wall > 0.99 * paced
    return paced


async def test_the_sims_decode_of_one_chat_loop_runs_at_plans_itl_and_distinct_prompts_do_not():
    cfg = load_config(CONFIG, OVERRIDES)
    planned, batch = planned_itl_and_batch(cfg)
    count = round(batch)
    chat = chat_requests(cfg, count, same_end=True)
    assert len({r.greedy_chain for r in chat}) == 1 and len({tuple(r.input_ids) for r in chat}) == count
    same_end = await simulated_itl(cfg, chat)
    assert abs(same_end / planned - 1) < TOLERANCE, (same_end, planned, batch)

    distinct = chat_requests(cfg, count, same_end=False)
    assert len({r.greedy_chain for r in distinct}) == count
    assert await simulated_itl(cfg, distinct) > 1.2 * planned


async def test_real_weights_price_the_chat_loop_per_request_in_the_sim_as_in_plan():
    cfg = load_config(CONFIG, [o for o in OVERRIDES if "load_format" not in o])
    planned, batch = planned_itl_and_batch(cfg)
    assert abs(await simulated_itl(cfg, chat_requests(cfg, round(batch), same_end=True)) / planned - 1) < TOLERANCE
