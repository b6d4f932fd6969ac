"""What benchmarks/closed_loop_waves.py reads (issue 25): the organisers' prefill ran their N = 32 clients in bursts, and
the planner's own prefill pipeline, handed such a burst at once, queues it into a TTFT of about a second."""

from __future__ import annotations

import statistics

from benchmarks import closed_loop_waves as waves
from orchestrator.config import load_config
from orchestrator.plan.simulation.simulate import simulate_run


def test_the_organisers_prefill_ran_its_clients_in_bursts_of_a_wave(capsys):
    sizes = waves.organisers()  # the whole bursts between the copied lines' edges
    out = capsys.readouterr().out
    assert sizes == [19, 18]  # N = 32 over two prefill servers: about half the clients each time
    assert "#queue-req <= 1" in out  # the waiting queue stays empty: the wave arrives over the burst, not at once


def test_a_synchronised_wave_of_equal_requests_waits_well_beyond_one_prefill():
    cfg = load_config(waves.ROOT / waves.QWEN_2026, paths_from=waves.ROOT)
    b = cfg.benchmark
    lone = simulate_run(cfg, [(b.input_tokens, b.output_tokens)], max_concurrency=None).ttft_s[0]
    wave = simulate_run(cfg, [(b.input_tokens, b.output_tokens)] * 36, max_concurrency=None)  # 18 per prefill server
    ttft = sorted(wave.ttft_s)
    assert ttft[0] < 1.2 * lone  # the first of the wave runs alone on an idle prefill
    # the rest queue in shared 8,192-token chunks: the median waits about half the wave's prefill, the last all of it
    assert statistics.median(ttft) > 5 * lone and ttft[-1] > 1.6 * statistics.median(ttft)


def test_the_send_groups_split_at_five_milliseconds():
    assert waves.send_groups([0.0, 0.001, 0.004, 0.5, 0.503, 2.0]) == [3, 2, 1]
    assert waves.send_groups([]) == []


def test_on_one_h100_the_transfer_workers_queue_regains_the_wave_the_prefill_smoothed():
    """call 9 at N = 16 (our NIXL patch's per-request times): prefill smooths the sends, the worker's pop bunches them."""
    stages = waves.measured_stages(waves.ONE_H100 / "serve-call9.tar.xz", 16)
    cv = {stage: float(waves.bin_terms(stages[stage])) for stage in ("send", "prefill scheduled", "KV enqueued", "worker pop")}
    assert cv["prefill scheduled"] < cv["send"] - 0.1
    assert cv["worker pop"] > cv["KV enqueued"] + 0.1
    queue_s, nixl_s = stages["_worker"]
    assert queue_s > 5 * nixl_s  # a queue many transfers long, not the transfers' own time
