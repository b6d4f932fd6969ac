"""Cost model: parameter and KV arithmetic of the DeepSeek presets, roofline behaviour, config wiring."""

from __future__ import annotations

import pytest

from orchestrator.config import config_from_dict
from orchestrator.config.model_presets import DEEPSEEK_R1, DEEPSEEK_V2_LITE
from orchestrator.perfmodel.costmodel import EngineCostModel, cost_model_for
from orchestrator.perfmodel.gpus import GB
from orchestrator.perfmodel.weights import checkpoint_bytes, experts_hit_fraction, param_counts
from orchestrator.perfmodel.gpus import GPU_SPECS, gpu_spec

H100 = GPU_SPECS["H100-SXM"]
H200 = GPU_SPECS["H200"]


def r1(**kw) -> EngineCostModel:
    # an explicit fraction: these tests check the arithmetic, not SGLang's default (test_backtest.py does)
    return EngineCostModel(arch=DEEPSEEK_R1, gpu=kw.pop("gpu", H100), **{"tp": 8, "mem_fraction_static": 0.88, **kw})


def test_deepseek_r1_has_671b_parameters_and_a_673_gb_fp8_checkpoint() -> None:
    assert param_counts(DEEPSEEK_R1).total / 1e9 == pytest.approx(671, rel=0.01)
    assert checkpoint_bytes(DEEPSEEK_R1, "fp8") / GB == pytest.approx(673, rel=0.01)
    assert checkpoint_bytes(DEEPSEEK_R1, "w4a8") / GB == pytest.approx(366, rel=0.02)
    assert param_counts(DEEPSEEK_V2_LITE).total / 1e9 == pytest.approx(15.7, rel=0.02)


def test_mla_kv_bytes_per_token_is_layers_times_latent_plus_rope_in_bf16() -> None:
    assert r1().kv_bytes_per_token() == 61 * (512 + 64) * 2


def test_fp8_r1_tp8_weights_are_84_gb_per_gpu_and_leave_no_kv_on_h100_but_do_on_h200() -> None:
    assert r1(quantization="fp8").weights_bytes_per_gpu() / GB == pytest.approx(84.4, abs=0.5)
    assert r1(quantization="fp8").kv_capacity_tokens() == 0
    assert r1(quantization="fp8", gpu=H200).kv_capacity_tokens() > 600_000


def test_tensor_parallel_halves_weights_and_mla_kv_does_not_grow_with_tp_but_does_with_dp_attention() -> None:
    tp8, tp16 = r1(quantization="w4a8"), r1(quantization="w4a8", tp=16, nnodes=2)
    assert tp16.weights_bytes_per_gpu() == pytest.approx(tp8.weights_bytes_per_gpu() / 2, rel=0.01)
    per_gpu_tokens = tp16.kv_bytes_per_gpu() / tp16.kv_bytes_per_token()
    assert tp16.kv_capacity_tokens() == pytest.approx(per_gpu_tokens, rel=1e-3)  # replicated, not summed
    dp_attn = r1(quantization="w4a8", dp=8, dp_attention=True)
    # eight schedulers' pools, each a little smaller: every rank holds all heads' attention weights and their
    # absorbed-MLA bf16 copies (2 GB a GPU for R1)
    assert dp_attn.kv_capacity_tokens() > 4 * tp8.kv_capacity_tokens()


def test_pipeline_parallel_splits_layers_so_weights_halve_and_kv_tokens_double() -> None:
    tp8, pp2 = r1(quantization="fp8", gpu=H200), r1(quantization="fp8", gpu=H200, pp=2, nnodes=2)
    assert pp2.weights_bytes_per_gpu() < 0.55 * tp8.weights_bytes_per_gpu()
    assert pp2.kv_capacity_tokens() > 2 * tp8.kv_capacity_tokens()


def test_experts_hit_by_a_batch_grow_from_top_k_to_all() -> None:
    assert experts_hit_fraction(1, 8, 256) == pytest.approx(8 / 256)
    assert experts_hit_fraction(4096, 8, 256) == pytest.approx(1.0)
    assert experts_hit_fraction(16, 8, 256) < experts_hit_fraction(64, 8, 256)


def test_step_times_grow_with_work_and_cached_prefix_is_cheaper_than_recompute() -> None:
    m = r1(quantization="w4a8")
    assert m.decode_step_s(1, 1000) < m.decode_step_s(64, 64_000) < m.decode_step_s(512, 512_000)
    assert m.decode_step_s(64, 64_000) < m.decode_step_s(64, 640_000)
    assert m.prefill_time_s([512]) < m.prefill_time_s([8192])
    assert m.prefill_time_s([100], [900]) < m.prefill_time_s([1000])
    assert m.prefill_time_s([4096, 4096]) == pytest.approx(m.prefill_time_s([4096, 4096], [0, 0]))
    with pytest.raises(ValueError, match="cached_tokens has 1 entries"):
        m.prefill_time_s([10, 10], [0])


def test_h200_decodes_faster_than_h100_for_the_same_weights() -> None:
    assert r1(quantization="w4a8", gpu=H200).decode_step_s(256, 256_000) < r1(quantization="w4a8").decode_step_s(256, 256_000)


def test_tp_over_two_nodes_pays_infiniband_all_reduces() -> None:
    one_node = r1(quantization="w4a8", tp=16, nnodes=1)  # hypothetical 16-GPU NVLink domain
    two_nodes = r1(quantization="w4a8", tp=16, nnodes=2)
    assert two_nodes.prefill_time_s([8192]) > one_node.prefill_time_s([8192])


def test_kv_transfer_over_infiniband_is_slower_than_nvlink_and_grows_with_tokens() -> None:
    m = r1(quantization="w4a8")
    assert m.kv_transfer_s(1000, same_node=False) > m.kv_transfer_s(1000, same_node=True)
    assert m.kv_transfer_s(4000, same_node=False) > m.kv_transfer_s(1000, same_node=False)


def test_startup_counts_disk_reads_cuda_graphs_and_cold_jit() -> None:
    decode, prefill = r1(quantization="w4a8", role="decode"), r1(quantization="w4a8", role="prefill")
    assert decode.startup_s("auto", disk_gb_s=2.0) - decode.startup_s("dummy") > 150  # 366 GB at 2 GB/s
    assert prefill.startup_s() < decode.startup_s()  # PD prefill captures no decode CUDA graphs
    cold_extra = len(decode.graph_batch_sizes()) * H100.graph_compile_cold_per_bs_s + H100.jit_cold_s - H100.jit_warm_s
    assert decode.startup_s(jit_cached=False) - decode.startup_s() == pytest.approx(cold_extra)


def test_cpu_fast_profile_runs_r1_steps_in_about_a_millisecond() -> None:
    m = r1(quantization="w4a8", gpu=GPU_SPECS["cpu-fast"])
    assert m.decode_step_s(50, 50 * 600) < 2e-3
    assert m.prefill_time_s([8192]) < 2e-3
    assert m.startup_s() < 1.0


def test_cost_model_for_reads_group_parallelism_overrides_and_engine_settings() -> None:
    cfg = config_from_dict({
        "cluster": {"gpu": "H100-SXM", "gpu_memory_gb": 96},
        "model": {"quantization": "w4a8"},
        "engine": {"kind": "sglang", "sglang": {"mem_fraction_static": 0.8}, "sim": {"efficiency_decode": 0.5}},
        "layout": {"mode": "aggregated", "aggregated": [
            {"tp": 8, "nnodes": 2, "pp": 2, "chunked_prefill_size": 4096, "max_running_requests": 64}]},
    })
    m = cost_model_for(cfg, "aggregated", cfg.layout.aggregated[0])
    assert (m.tp, m.pp, m.nnodes, m.gpus) == (8, 2, 2, 16)
    assert m.gpu.memory_gb == 96 and m.mem_fraction_static == 0.8 and m.efficiency_decode == 0.5
    assert m.chunked_prefill_tokens == 4096 and m.max_running() == 64


def test_the_sim_engine_is_timed_by_its_profile() -> None:
    cfg = config_from_dict({
        "engine": {"kind": "sim", "sim": {"profile": "cpu-fast"}},
        "layout": {"prefill": [{"tp": 8}], "decode": [{"tp": 8}]},
    })
    assert cost_model_for(cfg, "decode", cfg.layout.decode[0]).gpu.name == "cpu-fast"
    assert cost_model_for(cfg, "decode", cfg.layout.decode[0], gpu="H200").gpu.name == "H200"


def test_unknown_gpu_or_weight_format_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="allowed: .*H100-SXM"):
        gpu_spec("A100")
    with pytest.raises(ValueError, match=r"model.quantization='int3'.*allowed"):
        r1(quantization="int3")


@pytest.mark.parametrize("gpu", ["H200", "H100-SXM"])  # calibrated R1-shaped decode on both; roofline below
def test_fp8_kv_cache_dtype_halves_the_kv_bytes_a_decode_step_reads(gpu: str) -> None:
    def model(dtype: str) -> EngineCostModel:
        cfg = config_from_dict({
            "cluster": {"gpu": gpu},
            "model": {"quantization": "fp8"},
            "engine": {"kind": "sglang", "sglang": {"kv_cache_dtype": dtype, "mem_fraction_static": 0.9}},
            "layout": {"mode": "aggregated", "aggregated": [{"tp": 8, "pp": 2, "nnodes": 2}]},  # fits both GPUs
        })
        return cost_model_for(cfg, "aggregated", cfg.layout.aggregated[0])

    bf16, fp8 = model("auto"), model("fp8_e4m3")
    assert (bf16.kv_dtype_bytes, fp8.kv_dtype_bytes) == (2, 1)
    assert fp8.kv_capacity_tokens() > 1.9 * bf16.kv_capacity_tokens()
    for m in (bf16, fp8):
        assert m.calibration is not None and m.calibration.decode is not None  # the calibrated step, not the roofline
    # what a step pays for context is what it reads of the KV: half with FP8
    ctx_cost = {name: m.decode_step_s(64, 64 * 8000) - m.decode_step_s(64, 64 * 100) for name, m in (("bf16", bf16), ("fp8", fp8))}
    assert ctx_cost["fp8"] == pytest.approx(ctx_cost["bf16"] / 2, rel=0.02)


def test_fp8_kv_cache_dtype_halves_the_kv_read_of_a_roofline_step() -> None:
    bf16, fp8 = r1(gpu=H200), r1(gpu=H200, kv_dtype_bytes=1)
    assert bf16.calibration is None
    extra = [m.decode_step_s(256, 256 * 20000) - m.decode_step_s(256, 256 * 1000) for m in (bf16, fp8)]
    assert 0 < extra[1] < 0.6 * extra[0]
