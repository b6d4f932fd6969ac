"""Run simulation: single requests match the cost model exactly; batches keep their invariants."""

from __future__ import annotations

import pytest

from orchestrator.config import RunConfig, config_from_dict
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.plan.simulation.simulate import (
    SimulationError,
    simulate_run,
    synthetic_batch,
)
from orchestrator.stats import percentile


def pd_config(**cluster) -> RunConfig:
    return config_from_dict({
        "cluster": {"gpu": "H100-SXM", **cluster},
        "model": {"quantization": "w4a8"},
        # a fixed fraction: the small-memory cases shrink KV, not SGLang's default reserve (test_backtest.py)
        "engine": {"kind": "sglang", "sglang": {"mem_fraction_static": 0.88}},
        "layout": {"mode": "pd", "prefill": [{"tp": 8}], "decode": [{"tp": 8}]},
    })


def agg_config(count: int = 1) -> RunConfig:
    return config_from_dict({
        "cluster": {"gpu": "H200"},
        "model": {"quantization": "fp8"},
        "layout": {"mode": "aggregated", "aggregated": [{"count": count, "tp": 8}]},
    })


def test_one_pd_request_is_answer_latency_then_prefill_then_kv_transfer_then_one_decode_step_per_token() -> None:
    cfg = pd_config()
    prefill = cost_model_for(cfg, "prefill", cfg.layout.prefill[0], gpu="H100-SXM")
    decode = cost_model_for(cfg, "decode", cfg.layout.decode[0], gpu="H100-SXM")
    run = simulate_run(cfg, [(500, 4)])
    # a lone prompt on an idle prefill server: its forward lasts at least its launch (R1 runs prefill eagerly)
    forward = max(prefill.prefill_time_s([500]), prefill.prefill_launch_s(1))
    assert forward > prefill.prefill_time_s([500])  # a 500-token R1 forward on TP 8 is launch-bound
    ttft = prefill.gpu.answer_latency_s + forward + prefill.kv_transfer_s(500, same_node=False)
    steps = sum(decode.decode_step_s(1, 501 + i) for i in range(3))  # the first token came from prefill
    assert run.ttft_s == [pytest.approx(ttft)]
    assert run.e2e_s == [pytest.approx(ttft + steps)]
    assert run.duration_s == pytest.approx(ttft + steps)
    assert run.label == "simulated"


def test_a_long_prompt_is_prefilled_in_chunks_on_top_of_its_own_cache() -> None:
    cfg = agg_config()
    model = cost_model_for(cfg, "aggregated", cfg.layout.aggregated[0], gpu="H200")
    run = simulate_run(cfg, [(20_000, 2)])
    chunks = model.prefill_time_s([8192], [0]) + model.prefill_time_s([8192], [8192]) + model.prefill_time_s([3616], [16384])
    chunks += model.gpu.answer_latency_s  # what the client waits beyond the forwards
    assert run.ttft_s == [pytest.approx(chunks)]
    assert run.e2e_s == [pytest.approx(chunks + model.decode_step_s(1, 20_001))]


def test_a_batch_completes_every_request_with_consistent_times() -> None:
    batch = synthetic_batch(300, seed=7)
    for cfg in (pd_config(), agg_config(count=2)):
        run = simulate_run(cfg, batch)
        assert run.completed == run.num_requests == 300
        assert run.output_tokens == sum(o for _, o in batch) and run.input_tokens == sum(p for p, _ in batch)
        assert all(0 < t <= e for t, e in zip(run.ttft_s, run.e2e_s))
        assert max(run.e2e_s) == pytest.approx(run.duration_s)


def test_a_client_concurrency_of_one_runs_requests_back_to_back() -> None:
    cfg = pd_config()
    batch = [(200, 20), (300, 30), (100, 10)]
    alone = sum(simulate_run(cfg, [r]).duration_s for r in batch)
    serial = simulate_run(cfg, batch, max_concurrency=1)
    together = simulate_run(cfg, batch)
    assert serial.duration_s == pytest.approx(alone)
    assert together.duration_s < serial.duration_s


def test_a_smaller_kv_cache_queues_requests_and_slows_the_run() -> None:
    batch = synthetic_batch(400, seed=3)
    roomy = simulate_run(pd_config(), batch)
    tight = simulate_run(pd_config(gpu_memory_gb=52), batch)  # KV for ~15k tokens (the pool: 0.88 x (52 - 2.4 held) GiB)
    assert tight.duration_s > roomy.duration_s
    assert tight.ttft_p(99) > roomy.ttft_p(99)


def test_a_request_larger_than_the_kv_cache_is_refused_by_name() -> None:
    with pytest.raises(SimulationError, match=r"request 1 \(5,000 prompt \+ 5,000 output tokens\) cannot run on decode-0-0"):
        simulate_run(pd_config(gpu_memory_gb=51.5), [(100, 10), (5_000, 5_000)])  # KV for ~8k tokens


class _FlatCost:
    def prefill_time_s(self, new_tokens, cached_tokens=None, chunk_follows=False) -> float:
        return 0.01

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        return 0.001


@pytest.mark.parametrize("role,refused,why,runs", [
    # prompt + output = the pool: SGLang's admission needs prompt + max_new_tokens + a page below it
    ("aggregated", (900, 100), "SGLang cuts its output to 98 tokens", (900, 98)),
    ("decode", (400, 600), "SGLang cuts its output to 598 tokens", (400, 598)),
    # a PD decode pre-allocates prompt + 512 reserved tokens before the prefill runs: never, in a 1000-token pool
    ("decode", (600, 10), "prompt \\+ 512 reserved decode tokens", (488, 10)),
    ("aggregated", (995, 1), "SGLang aborts prompts of 994 tokens or more", (993, 1)),
])
def test_a_request_that_would_wait_forever_at_kv_capacity_is_refused_with_the_reason(role, refused, why, runs) -> None:
    from orchestrator.perfmodel.scheduling.limits import ServerLimits
    from orchestrator.plan.simulation.simulate import one_server_trace

    limits = ServerLimits(role, kv_capacity_tokens=1000, max_running=8, chunked_prefill_tokens=512)
    with pytest.raises(SimulationError, match=f"request 0 .*cannot run on {role}-0-0: .*{why}"):
        one_server_trace([refused], _FlatCost(), limits)
    [seq] = one_server_trace([runs], _FlatCost(), limits)  # just inside SGLang's bounds: it runs to its end
    assert seq.state == "done" and seq.output == runs[1]


def test_a_layout_whose_weights_leave_no_kv_is_refused() -> None:
    cfg = config_from_dict({"cluster": {"gpu": "H100-SXM"}, "model": {"quantization": "fp8"},
                            "layout": {"prefill": [{"tp": 8}], "decode": [{"tp": 8}]}})
    with pytest.raises(SimulationError, match="prefill-0-0: the weights leave no KV cache on H100-SXM"):
        simulate_run(cfg, [(10, 10)])


def test_the_reference_batch_simulates_every_token_and_no_faster_than_its_longest_request() -> None:
    from orchestrator.perfmodel.costmodel import cost_model_for

    cfg, batch = pd_config(), synthetic_batch(1000, seed=2025)
    run = simulate_run(cfg, batch)
    assert run.completed == len(run.ttft_s) == len(run.e2e_s) == 1000
    assert (run.input_tokens, run.output_tokens) == (sum(p for p, _ in batch), sum(o for _, o in batch))
    assert max(run.e2e_s) <= run.duration_s + 1e-9 and all(t <= e for t, e in zip(run.ttft_s, run.e2e_s))
    # a decode step of one request at its shortest context is the cheapest step there is: the longest output,
    # decoded alone, bounds the run from below
    role, _, group = next(g for g in cfg.layout.groups() if g[0] == "decode")
    prompt, output = max(batch, key=lambda request: request[1])
    assert run.duration_s >= (output - 1) * cost_model_for(cfg, role, group).decode_step_s(1, prompt + 1)


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile(list(range(101)), 99) == 99


def test_requests_two_decodes_take_at_one_instant_reach_the_prefill_together_as_the_first_wave_did() -> None:
    # two decode servers; the client keeps 2 in flight: the first two end at the same instant on different
    # decodes, and the next two are sent then. Each decode pre-allocates at its own turn; the prefill takes the
    # requests bootstrapped at one instant in one forward (SGLang's PrefillBootstrapQueue), so the second
    # wave repeats the first exactly (the planner once prefilled the first of them alone, then the other)
    cfg = config_from_dict({
        "cluster": {"gpu": "H100-SXM", "num_nodes": 3},
        "model": {"quantization": "w4a8"},
        "engine": {"kind": "sglang", "sglang": {"mem_fraction_static": 0.88}},
        "layout": {"mode": "pd", "prefill": [{"tp": 8}], "decode": [{"count": 2, "tp": 8}]},
    })
    run = simulate_run(cfg, [(500, 4)] * 4, max_concurrency=2)
    assert run.ttft_s == [pytest.approx(run.ttft_s[0])] * 4
    assert run.e2e_s == [pytest.approx(run.e2e_s[0])] * 4


def test_a_decode_pool_that_holds_the_batch_leaves_the_run_alone_and_a_smaller_one_holds_back_preallocation():
    # SGLang's PD decode pre-allocates a prompt's KV only with 512 tokens of headroom per active request
    # (admission.py): with the 1000 ShareGPT prompts of the V2-Lite rows, a pool far above prompt + 512 x requests
    # (H200 at 0.80 or 0.85: 2.8-3.1 M tokens for 0.85 M) schedules identically, while H100 at 0.55 (480 k tokens)
    # keeps more requests waiting and fewer running than at 0.65 (751 k): the mechanism benchmarks/pd_decode_terms.py
    # reads in the lease logs
    from pathlib import Path

    from orchestrator.config import load_config
    from orchestrator.plan.backtest.dataset import DATASET, build_batch, load_dataset

    root = Path(__file__).resolve().parents[2]
    batch = build_batch(load_dataset()["batches"]["v2lite-sharegpt-1000"], DATASET.parent)

    def run(*sets: str):
        cfg = load_config(root / "configs/device-h200x2-local-1p1d.yaml", list(sets), paths_from=root)
        waiting, running = [0], [0]

        def observe(now, server, forward, schedule):
            if forward.kind == "decode":
                waiting[0] = max(waiting[0], len(schedule.prealloc_queue))
                running[0] = max(running[0], len(forward.running))

        result = simulate_run(cfg, batch, max_concurrency=None, observe=observe)
        return result, waiting[0], running[0]

    h200_080, h200_085 = (run(f"layout.decode.0.mem_fraction_static={m}") for m in ("0.80", "0.85"))
    assert h200_080[1] == h200_085[1] == 0 and h200_080[2] == h200_085[2]
    assert h200_080[0].duration_s == h200_085[0].duration_s and h200_080[0].retracted == 0
    h100_065, h100_055 = (run("cluster.gpu=H100-SXM", f"layout.decode.0.mem_fraction_static={m}")
                          for m in ("0.65", "0.55"))
    assert h100_055[1] > h100_065[1] > 0 and h100_055[2] < h100_065[2]
