"""Three mechanisms of a PD pair's TTFT the planner prices: servers sharing one GPU time-slice it, SGLang's overlap loop
holds a prefill batch's KV until the next forward ends, and a layer shape without a profile (Qwen3) borrows its GPU's
prefill shares of peak from a profile in the same weight format."""

from __future__ import annotations

import pytest

from orchestrator.config import load_config
from orchestrator.config.model_presets import MODEL_PRESETS
from orchestrator.perfmodel.calibration_lookup import calibration_for
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.profile import shipped_profiles
from orchestrator.perfmodel.scheduling.timeslice import TimeSlicedGpu, shared_gpu_groups
from orchestrator.plan.closedloop.client import ClosedLoopLoad, simulate_closed_loop
from orchestrator.plan.simulation.servers import same_gpu_kv_note
from orchestrator.plan.simulation.simulate import simulate_run

ONE_GPU = "configs/device-h100x1-qwen3-serve.yaml"  # prefill + decode on one H100 (gpu_split: off)
TWO_GPUS = "configs/device-h200x2-qwen3-serve.yaml"  # a GPU per role


def test_forwards_in_flight_together_each_run_at_half_speed():
    gpu = TimeSlicedGpu("gpu0")
    gpu.start(0.0, "prefill", 0.030)
    gpu.start(0.0, "decode", 0.010)
    ends = {name: (at, token) for name, at, token in gpu.completions()}
    assert ends["decode"][0] == pytest.approx(0.020)  # 10 ms of work at half the GPU
    assert gpu.finish(0.020, "decode", ends["decode"][1])
    (name, at, _), = gpu.completions()  # alone again: the prefill's last 20 ms at full speed
    assert name == "prefill" and at == pytest.approx(0.040)
    assert not gpu.finish(0.030, "prefill", ends["prefill"][1])  # a completion re-timed since is stale


def test_only_a_pair_placed_on_one_gpu_shares_it():
    assert shared_gpu_groups(load_config(ONE_GPU, [])) == [["decode-0-0", "prefill-0-0"]]
    assert shared_gpu_groups(load_config(TWO_GPUS, [])) == []


def test_the_pair_on_one_gpu_is_slower_than_the_same_pair_on_two():
    shared = load_config(ONE_GPU, [])
    own = load_config(ONE_GPU, ["cluster.local.gpu_split=auto"])
    load = ClosedLoopLoad.of(shared, 4)
    on_one, on_two = simulate_closed_loop(shared, load), simulate_closed_loop(own, load)
    assert on_one.ttft_ms()["p50"] > 1.5 * on_two.ttft_ms()["p50"]  # its prefill forwards time-slice with decode steps
    assert on_one.itl_ms()["p50"] > on_two.itl_ms()["p50"]
    assert on_one.output_tok_s < on_two.output_tok_s


def test_the_overlap_loop_holds_a_batchs_kv_until_the_next_forward_ends():
    overlap = load_config(TWO_GPUS, [])
    no_overlap = load_config(TWO_GPUS, ["layout.prefill.0.extra_args=[--disable-overlap-schedule]"])
    burst = [(4000, 8)] * 6  # three prefill forwards back to back: the first two wait for the one after them
    held, sent = simulate_run(overlap, burst, max_concurrency=None), simulate_run(no_overlap, burst, max_concurrency=None)
    forward_s = cost_model_for(overlap, "prefill", overlap.layout.prefill[0]).prefill_time_s([4000, 4000])
    assert min(held.ttft_s) == pytest.approx(min(sent.ttft_s) + forward_s, rel=0.05)
    # the last batch has no next one, but its KV joins the held batch's on the one transfer worker, behind its two
    worker_s = cost_model_for(overlap, "prefill", overlap.layout.prefill[0]).kv_transfer_s(4000, same_node=True)  # one host
    late_s = max(held.ttft_s) - max(sent.ttft_s)  # that wait, then the decode's next turn (within one of its steps)
    assert 2 * worker_s - 1e-9 <= late_s <= 2 * worker_s + 0.1 * forward_s


@pytest.mark.parametrize("gpu", ["H100-SXM", "H200"])
def test_qwen3_prefill_borrows_its_gpus_fp8_prefill_shares(gpu):
    cfg = load_config(TWO_GPUS, [])
    cal = cost_model_for(cfg, "prefill", cfg.layout.prefill[0], gpu=gpu).calibration
    lender = next(p for p in shipped_profiles() if p.name == cal.prefill_lender)
    assert lender.gpu.name == gpu and lender.model.quantization == "fp8" and not cal.shape_matches
    measured = next(a for a in MODEL_PRESETS.values() if lender.model.matches(a, "fp8"))  # the layer the lender timed
    own = calibration_for(lender, measured, "fp8")
    assert (cal.efficiency_prefill, cal.efficiency_attention) == (own.efficiency_prefill, own.efficiency_attention)
    assert cal.efficiency_absorbed is None  # GQA has no absorbed-MLA path


def test_plan_says_a_kv_hand_off_inside_one_gpu_is_not_modelled():
    note = same_gpu_kv_note(load_config(ONE_GPU, []))
    assert note is not None and "not modelled" in note and "one GPU" in note
    assert same_gpu_kv_note(load_config(ONE_GPU, ["cluster.local.gpu_split=auto"])) is None  # a GPU each
    assert same_gpu_kv_note(load_config(TWO_GPUS, [])) is None
