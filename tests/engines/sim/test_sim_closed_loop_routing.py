"""A simulated `serve` + `goodput` on dummy weights decodes at the ITL `plan` predicts for the same config.

The contest's closed loop sends chat requests through one chat template: AIPerf's texts differ, every prompt ends with
the template's open assistant turn. On dummy weights such requests decode one greedy cycle of at most two tokens
(perfmodel/weights.decode_routing_tokens; docs/fidelity.md, "The closed-loop rows term by term"), so `plan` prices a
decode step of B of them as two routing tokens. The simulated engine sees token ids only: it keys each request by its
prompt's last token (sim_request.SimRequest.greedy_chain) and the step loop hands the batch's keys to the same cost
model, so its decode server must run at the planner's ITL, and requests whose prompts end differently must not.

Here (helpers: benchmarks/sim_greedy_chains.py, whose table docs/simulator.md quotes): the config's decode server built
as `serve` builds it (the backend's command line -> SimEngine), its scheduler paced on the wall clock (time_scale 0.25),
B requests decoding together, B the planner's time-average decode batch at N = 16 on that server; the ITL is read from
the seconds the scheduler paced (the wall clock can only lag them). Tolerance 5 %: the planner's loop runs a mix of batches around B and contexts around the
lockstep batch's; the step it prices differs by < 2 % over that mix. Distinct prompts route as B tokens: > 20 % slower.
"""


from __future__ import annotations

from benchmarks.sim_greedy_chains import (CLOSED_LOOP, DUMMY, SHORT, chat_requests, planned_itl_and_batch,
                                          simulated_itl)
from orchestrator.config import load_config

N = 16
TOLERANCE = 0.05


async def paced_itl(cfg, requests) -> float:
    paced, wall = await simulated_itl(cfg, requests)
    assert wall > 0.99 * paced  # the wall clock follows the paced timeline, never ahead of it
    return paced


async def test_the_sims_decode_of_one_chat_loop_runs_at_plans_itl_and_distinct_prompts_do_not():
    cfg = load_config(CLOSED_LOOP, [DUMMY, *SHORT])
    planned, batch = planned_itl_and_batch(cfg, N)
    count = round(batch)
    chat = chat_requests(cfg, count, same_end=True)
    assert len({r.greedy_chain for r in chat}) == 1 and len({tuple(r.input_ids) for r in chat}) == count
    same_end = await paced_itl(cfg, chat)
    assert abs(same_end / planned - 1) < TOLERANCE, (same_end, planned, batch)

    distinct = chat_requests(cfg, count, same_end=False)
    assert len({r.greedy_chain for r in distinct}) == count
    assert await paced_itl(cfg, distinct) > 1.2 * planned


async def test_real_weights_price_the_chat_loop_per_request_in_the_sim_as_in_plan():
    cfg = load_config(CLOSED_LOOP, SHORT)
    planned, batch = planned_itl_and_batch(cfg, N)
    assert abs(await paced_itl(cfg, chat_requests(cfg, round(batch), same_end=True)) / planned - 1) < TOLERANCE
