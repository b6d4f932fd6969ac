"""The qwen3-235b-a22b-fp8 preset (GQA MoE) in the memory and cost models, and `plan` on the 2026 reference layout."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.model_presets import DEEPSEEK_R1, MODEL_PRESETS, QWEN3_235B_A22B_FP8, ModelArchitecture
from orchestrator.perfmodel.calibration_lookup import calibration_for, expert_stream_share, graphed_step_floor
from orchestrator.perfmodel.costmodel import EngineCostModel, build_cost_model
from orchestrator.perfmodel.server.forward import WEIGHT_READ_EFFICIENCY
from orchestrator.perfmodel.profile import shipped_profiles
from orchestrator.perfmodel.weights import checkpoint_bytes, param_counts
from orchestrator.perfmodel.server.triton_gqa import TRITON_GQA_ITERATION_S

ROOT = Path(__file__).resolve().parents[2]


def test_preset_equals_the_config_json_in_models():
    parsed = ModelArchitecture.from_hf_config(ROOT / "models" / "qwen3-235b-a22b-fp8" / "config.json")
    assert dataclasses.replace(parsed, name=QWEN3_235B_A22B_FP8.name) == QWEN3_235B_A22B_FP8
    assert not parsed.is_mla and parsed.qk_head_dim == parsed.value_head_dim == 128


def test_parameter_counts_match_the_model_card():
    """235B total, 22B activated (Qwen3-235B-A22B's card)."""
    arch, p = QWEN3_235B_A22B_FP8, param_counts(QWEN3_235B_A22B_FP8)
    assert 234.5e9 < p.total < 235.5e9
    active = (p.attention + p.router + p.embedding + p.lm_head
              + arch.num_experts_per_tok * arch.moe_layers * p.one_expert_per_layer)
    assert 21.5e9 < active < 22.5e9
    # block FP8 (one fp32 scale per 128x128) with BF16 embeddings/lm_head: ~236 GB of checkpoint
    assert 235e9 < checkpoint_bytes(arch, "fp8") < 238e9


def test_gqa_kv_is_split_over_tp_ranks_and_mla_is_replicated():
    full = 94 * 2 * 4 * 128 * 2  # layers x (K, V) x KV heads x head_dim x BF16
    tp4 = build_cost_model(QWEN3_235B_A22B_FP8, "H100-SXM", "fp8", tp=4, mem_fraction_static=0.9,
                           context_length=8192)
    tp8 = build_cost_model(QWEN3_235B_A22B_FP8, "H100-SXM", "fp8", tp=8, mem_fraction_static=0.9,
                           context_length=8192)
    assert tp4.kv_bytes_per_token() == tp8.kv_bytes_per_token() == full
    assert tp4.kv_bytes_per_gpu_token() == full / 4  # one KV head per rank
    assert tp8.kv_bytes_per_gpu_token() == full / 4  # 4 KV heads cannot split 8 ways: replicated
    assert tp4.kv_capacity_tokens() == int(tp4.kv_bytes_per_gpu() // (full / 4))
    r1 = build_cost_model(DEEPSEEK_R1, "H200", "fp8", tp=8)
    assert r1.kv_bytes_per_gpu_token() == r1.kv_bytes_per_token()  # MLA's latent lives on every rank


def _decode_server(gpu: str = "H100-SXM", **server) -> EngineCostModel:
    return build_cost_model(QWEN3_235B_A22B_FP8, gpu, "fp8", tp=4, ep=4, mem_fraction_static=0.9,
                            context_length=8192, role="decode", max_running_requests=256, **server)


def test_decode_reads_each_ranks_kv_share_every_step():
    """A decode step reads its rank's KV share (48 KiB/token at TP4, not the whole 188 KiB) on top of weights, at
    the streaming rate the measured fixed costs were fitted against, sped or slowed by the attention backend relative
    to the one the floor was measured with (triton: fa3 is 1 / 0.94 as fast on this kernel); on triton each layer's
    attention also lasts at least its programs' serial walk (server/triton_gqa.py), which at one KV head a GPU and
    batch 64 outlasts the bytes at 4,200 tokens, not at 100."""
    for backend, speed in (("triton", 1.0), ("fa3", 1 / 0.94)):
        cost = _decode_server(attention_backend=backend)
        assert cost.calibration.attention_backend == "triton"
        short, long = cost.decode_step_s(64, 64 * 100), cost.decode_step_s(64, 64 * 4200)
        read_s = [64 * n * cost.kv_bytes_per_gpu_token() / (cost.gpu.hbm_tb_s * 1e12 * WEIGHT_READ_EFFICIENCY) / speed
                  for n in (100, 4200)]
        wait_s = [cost._triton_gqa_wait_s(64, 64 * n, r) for n, r in zip((100, 4200), read_s)]
        assert (wait_s[1] > 0) == (backend == "triton")
        assert long - short == pytest.approx(read_s[1] - read_s[0] + wait_s[1] - wait_s[0], rel=1e-6)


def test_the_attention_backend_changes_only_the_attention_kernel_of_a_lent_floor_step():
    """With no context to attend over, a Qwen3-shaped graphed step is the same on triton and fa3 but for triton's one
    32-token walk a layer (server/triton_gqa.py): weight reads, experts and the lent floor (measured on triton) run no
    attention kernel; the old whole-step / 0.94 made triton 6 % longer."""
    triton, fa3 = _decode_server(attention_backend="triton"), _decode_server(attention_backend="fa3")
    walk = triton._triton_gqa_wait_s(16, 16, 0.0)
    assert walk == pytest.approx(94 * TRITON_GQA_ITERATION_S)
    assert triton.decode_step_s(16, 16) - walk == pytest.approx(fa3.decode_step_s(16, 16), rel=1e-3)
    assert triton.decode_step_s(16, 16 * 4000) > fa3.decode_step_s(16, 16 * 4000)


def test_expert_stream_share_is_measured_from_the_routing_pair_not_assumed():
    """The fused-MoE kernel's expert read share comes from the two H200 R1-shaped profiles that differ only in routing
    (dummy vs randomised gates): their step difference over the expert bytes the two routings read. It lies above the
    80 % assumed for every other read and below the datasheet; without such a pair there is none."""
    pool = shipped_profiles()
    share = expert_stream_share("H200", pool)
    assert share is not None and WEIGHT_READ_EFFICIENCY < share < 1.0
    assert expert_stream_share("H100-SXM", pool) == share  # same die, the same kernel
    assert expert_stream_share("H200", [p for p in pool if not p.model.real_like]) is None
    # a Qwen3-shaped step's routed experts stream at that share: two batches differ by their expert bytes at it
    cost = _decode_server()
    assert cost.calibration.graph_expert_read_share == share
    experts = cost._weight_bytes_read(32)[1] - cost._weight_bytes_read(8)[1]
    other = cost.weight_read_s(32) - cost.weight_read_s(8) - experts / (cost.gpu.hbm_tb_s * 1e12 * WEIGHT_READ_EFFICIENCY)
    assert other == pytest.approx(0.0, abs=1e-12)
    assert cost.decode_step_s(32, 32) - cost.decode_step_s(8, 8) == pytest.approx(
        experts / (cost.gpu.hbm_tb_s * 1e12 * share) + cost._comm_s(32) - cost._comm_s(8), rel=0.02)


def test_graphed_step_floor_reproduces_the_fixed_time_each_gpus_profiles_measured():
    """The per-step and per-layer fixed costs of a graphed decode come from the shipped profiles: each GPU's line
    S + layers x L goes through the mean fixed time (layers x fitted layer_s) its own profiles left after weights."""
    pool = shipped_profiles()
    for gpu in ("H100-SXM", "H200"):
        floor = graphed_step_floor(gpu, pool)
        assert floor is not None
        step_s, layer_s = floor
        fixed = []
        for profile in (p for p in pool if p.gpu.name == gpu and p.purpose == "calibration"):  # not lease 8's counts
            arch = next(a for a in MODEL_PRESETS.values() if profile.model.matches(a, profile.model.quantization))
            layers = profile.model.num_hidden_layers
            decode = calibration_for(profile, arch, profile.model.quantization).decode
            fixed.append(step_s + layers * layer_s - layers * decode.layer_s)
        assert sum(fixed) == pytest.approx(0.0, abs=1e-9)
    # the slope comes from H200's two layer counts (6: R1-shaped; 27: V2-Lite) and holds for H100 (same die)
    assert graphed_step_floor("H100-SXM", pool)[1] == graphed_step_floor("H200", pool)[1]
    assert graphed_step_floor("cpu-fast", pool) is None
    # one GPU's profiles at a single layer count cannot tell step from layer apart
    assert graphed_step_floor("H100-SXM", [p for p in pool if p.gpu.name == "H100-SXM"]) is None


def test_a_shape_without_a_profile_decodes_on_the_measured_floor_not_the_assumed_fixed_costs():
    """Qwen3 (no profile of its layer shape): a graphed decode step = weight and KV reads at WEIGHT_READ_EFFICIENCY
    (routed experts at their kernel's measured share) + TP all-reduces + the shape's measured per-step and per-layer
    floor (its layer counts on this GPU's host; the GPU's cross-shape floor, gpus.GpuSpec, where it has none). Eager steps last at
    least their CPU launch (ForwardTerms.eager_launch_s)."""
    cost = _decode_server(attention_backend="triton")  # the lenders' backend: the KV read at the floor's own rate
    cal = cost.calibration
    assert cal is not None and not cal.shape_matches and cal.decode is None
    assert cal.graph_step_s is not None and cal.graph_layer_s is not None and cal.graph_expert_read_share is not None
    bs, ctx = 12, 12 * 4100
    hbm = cost.gpu.hbm_tb_s * 1e12
    experts = cost._weight_bytes_read(bs)[1]
    reads = (cost.weight_read_s(bs) - experts / (hbm * WEIGHT_READ_EFFICIENCY) + experts / (hbm * cal.graph_expert_read_share)
             + ctx * cost.kv_bytes_per_gpu_token() / (hbm * WEIGHT_READ_EFFICIENCY))
    wait = cost._triton_gqa_wait_s(bs, ctx, ctx * cost.kv_bytes_per_gpu_token() / (hbm * WEIGHT_READ_EFFICIENCY))
    reads += wait  # triton's serial walk beyond the bytes (server/triton_gqa.py)
    floor = cal.graph_step_s + 94 * cal.graph_layer_s
    assert cost.decode_step_s(bs, ctx) == pytest.approx(reads + cost._comm_s(bs) + floor, rel=1e-6)
    # the shape's own floor from its layer counts on this GPU's host (lease 12: 0.041 ms + 98.2 us per layer), in place
    # of the GPU's cross-shape one, for its roofline forwards too (calibration_lookup.lent_floor_split)
    assert (cal.graph_step_s, cal.graph_layer_s) == (cal.floor_step_s, cal.floor_layer_s)
    assert floor == pytest.approx(0.041e-3 + 94 * 98.2e-6, rel=0.005)
    cross_shape = cost.gpu.step_overhead_s + 94 * cost.gpu.layer_overhead_s
    eager = _decode_server(attention_backend="triton", cuda_graph_max_bs=8)
    # (and their all-reduces pay the eager NCCL floor instead of the graph replay's: parallel/collectives.py)
    eager_comm = eager._comm_s(bs, eager=True) - cost._comm_s(bs)
    assert eager_comm > 0
    assert eager.decode_step_s(bs, ctx) == pytest.approx(
        max(cost.decode_step_s(bs, ctx) + eager_comm, eager.eager_launch_s(bs)), rel=1e-6)
    # the uncalibrated roofline (no profile at all; SGLang's own backend, not triton) charges the same read shares on the
    # GPU's cross-shape floor (gpus.GpuSpec)
    bare = build_cost_model(QWEN3_235B_A22B_FP8, "H100-SXM", "fp8", calibrated=False, tp=4, ep=4, mem_fraction_static=0.9,
                            context_length=8192, role="decode", max_running_requests=256)
    assert bare.decode_step_s(bs, ctx) - cross_shape == pytest.approx(cost.decode_step_s(bs, ctx) - floor - wait, rel=0.02)


def test_plan_fits_the_2026_reference_layout():
    out = subprocess.run([sys.executable, "-m", "orchestrator", "plan", "--config", "configs/qwen3-pd-2026.yaml"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    # exit 1 = no declared N clears the SLA gate: a prediction of the (uncalibrated) cost model, not an error
    assert out.returncode in (0, 1) and not out.stderr, out.stderr[-2000:]
    assert "memory: fits (qwen3-235b-a22b-fp8 FP8)" in out.stdout
    # the batch back-test's band is R1's: for this model plan prints its closed-loop back-test instead of borrowing it
    assert "back-test error band: closed-loop back-test of qwen3-235b-a22b-fp8" in out.stdout
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("layout.")]
    assert [(r[0], r[1], r[3], r[-1]) for r in rows] == [("layout.prefill.0", "2", "TP4", "fits"),
                                                      ("layout.decode.0", "2", "TP4", "fits")]


def test_max_running_requests_caps_the_captured_graph_sizes():
    """SGLang captures no decode graph above its request pool (cuda_graph_runner.get_batch_sizes_to_capture filters
    sizes by req_to_token_pool.size = --max-running-requests): the reference decode server (TP4, default graph max 512
    on H100) captures 1..256, 36 sizes, and its start-up pays for those only."""
    capped = _decode_server()
    assert capped.graph_max_bs == 512  # the TP4 default before the pool filter
    assert capped.graph_batch_sizes()[-1] == 256 and len(capped.graph_batch_sizes()) == 36
    odd = build_cost_model(QWEN3_235B_A22B_FP8, "H100-SXM", "fp8", tp=4, ep=4, mem_fraction_static=0.9,
                           context_length=8192, role="decode", max_running_requests=100)
    assert odd.graph_batch_sizes()[-3:] == [88, 96, 100]  # the pool size itself is captured
    uncapped = build_cost_model(QWEN3_235B_A22B_FP8, "H100-SXM", "fp8", tp=4, ep=4, mem_fraction_static=0.9,
                                context_length=8192, role="decode")
    assert uncapped.graph_batch_sizes()[-1] == 512
    assert capped.startup_s() < uncapped.startup_s()
