"""Memory preflight: the known-cases table (verdicts + key numbers), little-KV, options, bench's refusal."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.compressed import read_text
from orchestrator.config import config_from_dict, load_config
from orchestrator.plan.memory.preflight import check_layout_fits, require_fit
from orchestrator.plan.memory.report import DOES_NOT_FIT, FITS, LITTLE_KV, LayoutDoesNotFit

ROOT = Path(__file__).resolve().parents[2]


def pd_1p1d(gpu: str, quantization: str, preset: str = "DeepSeek-R1", tp: int = 8, gpus_per_node: int = 8) -> dict:
    return {
        "cluster": {"gpu": gpu, "gpus_per_node": gpus_per_node},
        "model": {"preset": preset, "quantization": quantization},
        "layout": {"mode": "pd", "prefill": [{"tp": tp}], "decode": [{"tp": tp}]},
    }


@dataclass
class Case:
    name: str
    config: dict
    verdict: str
    weights_gb: float  # per GPU, GB = 1e9 bytes
    min_kv_tokens: int
    max_kv_tokens: int


# KV ranges follow SGLang 0.5.17's default mem_fraction_static for each GPU, TP and role (the configs leave
# it unset): prefill 0.831 / decode 0.875 on H100 TP8, 0.904 / 0.929 on H200 TP8, 0.806 aggregated TP16 (no
# prefill-graph reserve for MLA: tests/perfmodel/test_sglang_defaults.py).
KNOWN_CASES = [
    Case("FP8 R1 1P1D TP8/TP8 on 8xH100", pd_1p1d("H100-SXM", "fp8"), DOES_NOT_FIT, 84.4, 0, 0),
    Case("FP8 R1 1P1D TP8/TP8 on 8xH200", pd_1p1d("H200", "fp8"), FITS, 84.4, 700_000, 830_000),
    Case("W4A8 R1 1P1D TP8/TP8 on 8xH100", pd_1p1d("H100-SXM", "w4a8"), FITS, 46.1, 320_000, 440_000),
    Case(
        "FP8 R1 aggregated TP16 on 2x8 H100",
        {
            "cluster": {"gpu": "H100-SXM"},
            "model": {"quantization": "fp8"},
            "layout": {"mode": "aggregated", "aggregated": [{"tp": 16, "nnodes": 2}]},
        },
        FITS, 42.1, 340_000, 390_000,
    ),
    Case(
        "BF16 DeepSeek-V2-Lite 1P1D on 2xH200 (1 GPU each)",
        pd_1p1d("H200", "bf16", preset="DeepSeek-V2-Lite", tp=1, gpus_per_node=1),
        FITS, 31.5, 3_300_000, 3_600_000,
    ),
]


@pytest.mark.parametrize("case", KNOWN_CASES, ids=lambda c: c.name)
def test_known_cases(case: Case) -> None:
    report = check_layout_fits(config_from_dict(case.config))
    assert report.verdict == case.verdict
    for group in report.groups:
        assert group.weights_gb == pytest.approx(case.weights_gb, abs=0.5)
        assert case.min_kv_tokens <= group.kv_capacity_tokens <= case.max_kv_tokens


def test_fp8_r1_on_h100_names_the_numbers_and_the_layouts_that_fit() -> None:
    report = check_layout_fits(config_from_dict(pd_1p1d("H100-SXM", "fp8")))
    summary = report.summary()
    assert "layout.prefill.0: FP8 DeepSeek-R1 TP8 needs 84.4 GB/GPU for weights alone" in summary  # 0.26 of it w_kc/w_vc
    # SGLang 0.5.17's default fraction for a TP8 prefill on H100: (81,920 - 13,824) / 81,920 MiB, no prefill-graph reserve
    # (the MLA prefill graph is off before the reserve is computed; it was 0.812 with 1.5 GiB for it), of the memory free
    # when the weights load: 80 GiB less 1.51 (a lone H100's logs) and 0.9 (a server of several GPUs)
    assert "0.83 x 83.3 GB free at weight load = 69.2 GB" in summary
    options = " | ".join(report.options)
    for option in ("W4A8 checkpoint", "H200 nodes", "aggregated TP16 over both nodes"):
        assert option in options


def test_a_small_gpu_memory_override_leaves_little_kv_for_the_batch() -> None:
    cfg = config_from_dict({**pd_1p1d("H100-SXM", "w4a8"), "cluster": {"gpu": "H100-SXM", "gpu_memory_gb": 60}})
    report = check_layout_fits(cfg, batch=[(300, 200)] * 1000)
    decode = next(g for g in report.groups if g.role == "decode")
    assert decode.verdict == LITTLE_KV and report.verdict == LITTLE_KV
    assert decode.kv_needed_tokens == 1000 * 500 and decode.kv_capacity_tokens < 250_000
    assert report.fits  # little KV runs, slowly; only does-not-fit stops bench
    assert "most requests will queue" in report.summary()


def test_a_request_longer_than_the_kv_cache_does_not_fit() -> None:
    cfg = config_from_dict({
        **pd_1p1d("H100-SXM", "w4a8"), "cluster": {"gpu": "H100-SXM", "gpu_memory_gb": 51.3},
        "engine": {"kind": "sglang", "sglang": {"mem_fraction_static": 0.88}},
    })
    report = check_layout_fits(cfg, batch=[(4000, 4000)] * 10)
    assert report.verdict == DOES_NOT_FIT
    assert "leaving KV for only" in report.summary()


def test_bench_refuses_a_layout_that_does_not_fit_unless_forced() -> None:
    cfg = config_from_dict(pd_1p1d("H100-SXM", "fp8"))
    with pytest.raises(LayoutDoesNotFit, match=r"(?s)layout.decode.0.*--force"):
        require_fit(cfg)
    assert require_fit(cfg, force=True).verdict == DOES_NOT_FIT
    assert require_fit(load_config(ROOT / "configs/default.yaml")).fits


def test_the_shipped_2p1d_tp4_h100_preset_does_not_fit_w4a8_r1_at_tp4() -> None:
    # 366 GB of W4A8 weights over 4 GPUs is ~92 GB/GPU, more than an 80 GB H100
    report = check_layout_fits(load_config(ROOT / "configs/h100-2p1d-tp4.yaml"))
    prefill = next(g for g in report.groups if g.role == "prefill")
    assert prefill.verdict == DOES_NOT_FIT and prefill.weights_gb == pytest.approx(92.1, abs=0.5)


def test_the_memory_check_reads_the_server_spec_not_the_group() -> None:
    from dataclasses import replace

    from orchestrator.config.server_spec import server_spec
    from orchestrator.plan.memory.server_fit import group_memory

    cfg = config_from_dict(pd_1p1d("H200", "fp8"))
    group = cfg.layout.decode[0]
    spec = server_spec(cfg, "decode", group)
    as_config = group_memory(cfg, "decode", 0, group)
    # a spec that differs from what the group says: the check must report the spec's server
    narrower = replace(spec, memory=replace(spec.memory, mem_fraction_static=0.75),
                       parallel=replace(spec.parallel, dp=8, dp_attention=True))
    as_spec = group_memory(cfg, "decode", 0, group, spec=narrower)
    assert as_spec.layout == "1 x TP8DP8a" and as_config.layout == "1 x TP8"
    assert as_spec.static_pool_gb == pytest.approx(0.75 * (141 - 1.88 - 0.9) * 2**30 / 1e9)  # of the memory free at load
    assert as_spec.static_pool_gb < as_config.static_pool_gb
    assert as_spec.kv_capacity_tokens > as_config.kv_capacity_tokens  # DP attention: each rank its own requests' KV


def test_fp8_kv_cache_dtype_doubles_the_kv_tokens_the_memory_check_reports() -> None:
    def report(dtype: str):
        data = pd_1p1d("H200", "fp8")
        data["engine"] = {"sglang": {"kv_cache_dtype": dtype}}
        return check_layout_fits(config_from_dict(data)).groups[0]

    bf16, fp8 = report("auto"), report("fp8_e4m3")
    assert fp8.kv_gb == pytest.approx(bf16.kv_gb)  # same pool left after the weights ...
    assert fp8.kv_capacity_tokens == pytest.approx(2 * bf16.kv_capacity_tokens, rel=0.001)  # ... twice the tokens


def _h200_pd_decode(**group: object):
    from orchestrator.perfmodel.costmodel import cost_model_for

    cfg = load_config(ROOT / "configs/device-h200x2-local-1p1d.yaml")
    decode = cfg.layout.decode[0].model_copy(update=group)
    return cfg, cost_model_for(cfg, "decode", decode)


def test_the_eager_decode_buffer_is_the_one_that_killed_the_h200_decode() -> None:
    # benchmarks/results/2026-11-26-two-gpu-h200x2 call 2, decode log: "Tried to allocate 6.34 GiB" in
    # triton_backend.init_forward_metadata (attn_logits) with 811 requests in flight, 5.43 GiB free, 5.83 GiB held
    # by the allocator (the previous eager step's buffer); call 5 ran eager steps of up to 641 requests and lived.
    # The allocator's line: 134.37 GiB in use, 5.83 reserved but unallocated, against 139.80 - 17.96 in use after start:
    # 6.70 GiB allocated beyond start when the new attn_logits was asked for = the previous step's split-KV buffers
    # and its fp32 logits (811 x 102,400 vocab x 4 B), which the overlap scheduler still holds.
    _, model = _h200_pd_decode()
    assert model.split_kv_bytes(811) / 2**30 == pytest.approx(6.34, rel=0.01)  # 811 x 16 heads x 256 splits x 513 x 4 B
    live_before = model.eager_decode_bytes(811) - model.split_kv_bytes(811)
    assert live_before / 2**30 == pytest.approx(134.37 - (139.80 - 17.96) - 5.83, abs=0.06)
    assert model.eager_decode_bytes(256) == 0  # a captured graph runs it: its buffers are part of start-up
    assert model.free_after_start_bytes() / 2**30 == pytest.approx(17.96, rel=0.05)  # "available_gpu_mem" logged
    assert model.activation_headroom_ok(641) and not model.activation_headroom_ok(811)


R1_SHAPED = ROOT / "benchmarks/backtest/configs/h200-r1shaped-6l.yaml"
# lease 3's eager servers (benchmarks/results/2026-11-26-two-gpu-lease3-h100x2): R1 layer shape, 6 layers, no graphs,
# triton with --triton-attention-split-tile-size 256 at context 16,384 (64 splits), mem fraction 0.70
R1_EAGER = ["cluster.gpu=H100-SXM", "model.context_length=16384", "engine.sglang.triton_attention_split_tile_size=256",
            "layout.aggregated.0.disable_cuda_graph=true", "layout.aggregated.0.disable_prefill_cuda_graph=true"]


def _r1_eager(*extra: str):
    from orchestrator.perfmodel.costmodel import cost_model_for

    cfg = load_config(R1_SHAPED, R1_EAGER + list(extra), paths_from=ROOT)
    role, _, group = next(iter(cfg.layout.groups()))
    return cost_model_for(cfg, role, group)


def test_the_r1_shaped_eager_decode_that_died_at_512_and_the_ones_that_ran() -> None:
    # TP 1 at 512 (call 3's server log): "Tried to allocate 8.00 GiB ... 6.93 GiB is free ... 63.43 GiB is allocated
    # by PyTorch, and 8.08 GiB is reserved"; weights 37.69 + pool 17.47 GiB + 0.07 at start: 8.20 GiB allocated beyond
    # start = the previous step's split-KV buffers and fp32 logits (512 x 129,280 x 4 B)
    tp1 = _r1_eager()
    assert tp1.split_kv_bytes(512) / 2**30 == pytest.approx(8.00, rel=0.01)  # 512 x 128 heads x 64 splits x 513 x 4 B
    live_before = tp1.eager_decode_bytes(512) - tp1.split_kv_bytes(512)
    assert live_before / 2**30 == pytest.approx(63.43 - 37.69 - 17.47 - 0.07, abs=0.1)
    assert not tp1.activation_headroom_ok(512)
    assert tp1.activation_headroom_ok(256)  # ran (call 3), as TP 2 at 512 did (call 2; 64 heads a GPU)
    assert _r1_eager("cluster.gpus_per_node=2", "layout.aggregated.0.tp=2").activation_headroom_ok(512)
    # without the runs' split tile SGLang takes min(next_pow2(132 SMs), next_pow2(16,384 / 32)) = 256 splits: 4x the
    # buffers, and the same servers could not run an eager step of 256
    untiled = _r1_eager("engine.sglang.triton_attention_split_tile_size=null")
    assert untiled.split_kv_bytes(256) == pytest.approx(4 * tp1.split_kv_bytes(256))
    assert not untiled.activation_headroom_ok(256)


def test_under_pp_an_eager_decode_buffer_is_one_micro_batchs_not_the_whole_batchs() -> None:
    # SGLang 0.5.17 keeps pp_size micro-batches in flight (scheduler_pp_mixin.py init_pp_loop_state), each admitted up
    # to max_running_requests // pp_size (scheduler.py pp_max_micro_batch_size); a stage's forward runs one of them, so
    # its triton attn_logits (and the previous forward's, still referenced) are sized by the micro-batch
    _, flat = _h200_pd_decode()
    _, piped = _h200_pd_decode(pp=2)
    assert flat.captured_graph_max_bs == piped.captured_graph_max_bs == 256
    assert flat.eager_decode_bytes(500) > 0 and piped.eager_decode_bytes(500) == 0  # two micro-batches of 250: graphs
    assert piped.eager_decode_bytes(811) == pytest.approx(flat.eager_decode_bytes(406))  # micro-batches of 406 + 405
    assert piped.eager_decode_bytes(811) < 0.51 * flat.eager_decode_bytes(811)


def test_the_h200_pd_decode_at_085_fits_1000_prompts_as_pp2_in_micro_batches_of_500() -> None:
    data = load_config(ROOT / "configs/device-h200x2-local-1p1d.yaml").model_dump(mode="json")
    data["cluster"]["gpus_per_node"] = 2
    data["layout"]["decode"][0]["pp"] = 2
    report = check_layout_fits(config_from_dict(data), batch=[(341, 221)] * 1000)
    # eager micro-batches of 500: 2 x 3.9 GiB x 1.5 fit the ~18 GB left after start (1000 at once would need 23.4)
    assert next(g for g in report.groups if g.role == "decode").verdict == FITS


def test_the_h200_pd_config_at_085_is_refused_with_the_two_fixes_and_passes_with_room() -> None:
    cfg = load_config(ROOT / "configs/device-h200x2-local-1p1d.yaml")
    batch = [(341, 221)] * 1000  # the run's 1000 prompts: 341,326 input / 220,890 output tokens
    report = check_layout_fits(cfg, batch=batch)
    decode = next(g for g in report.groups if g.role == "decode")
    assert decode.verdict == DOES_NOT_FIT and not report.fits
    assert "eager decode step of 1000 requests past the largest CUDA graph (256)" in decode.reason
    assert "layout.decode.0.mem_fraction_static <= 0.8" in decode.reason
    assert "layout.decode.0.max_running_requests <= 256" in decode.reason
    with pytest.raises(LayoutDoesNotFit, match="attn_logits"):
        require_fit(cfg, batch=batch)
    for fix in ({"mem_fraction_static": 0.80}, {"max_running_requests": 256}):
        fixed = _with_decode(cfg, **fix)
        assert check_layout_fits(fixed, batch=batch).verdict == FITS, fix


def _with_decode(cfg, **group: object):
    data = cfg.model_dump(mode="json")
    data["layout"]["decode"][0].update(group)
    return config_from_dict(data)


def test_a_pd_pair_on_one_gpu_is_judged_as_one_gpu_with_both_servers_and_their_kv_caps() -> None:
    # configs/device-h100x1-1p1d.yaml: prefill + decode on the one H100 (gpu_split off), 0.92 each, pools capped
    # at 120k tokens; it ran 1000 prompts on 2026-11-26 (benchmarks/results/2026-11-26-sglang-one-h100) without OOM
    cfg = load_config(ROOT / "configs/device-h100x1-1p1d.yaml")
    batch = [(341, 221)] * 1000
    report = check_layout_fits(cfg, batch=batch)
    prefill, decode = report.groups
    assert prefill.kv_capacity_tokens == decode.kv_capacity_tokens == 120_000  # the cap, not 0.92's 1.5M tokens
    assert prefill.kv_gb == pytest.approx(120_000 * 31_104 / 1e9, rel=0.01)  # V2-Lite MLA: 27 x 576 x bf16
    # one GPU's memory for both: 85.9 GB - 2 x 31.5 weights - 2 x 3.7 KV, not 0.08 x 85.9 each
    assert prefill.reserve_gb == decode.reserve_gb == pytest.approx(85.9 - 2 * 31.5 - 2 * 3.73, abs=0.2)
    assert len(report.shared) == 1 and "layout.prefill.0 + layout.decode.0" in report.shared[0]
    assert "one GPU shared by" in report.table()
    assert report.fits and decode.verdict == LITTLE_KV  # 120k tokens for 1000 requests: they queue


def test_two_uncapped_servers_on_one_gpu_do_not_fit_whichever_starts_second() -> None:
    uncapped = _with_engine(load_config(ROOT / "configs/device-h100x1-1p1d.yaml"), max_total_tokens=None)
    report = check_layout_fits(uncapped, batch=[(341, 221)] * 1000, suggest=False)
    assert report.verdict == DOES_NOT_FIT
    for group in report.groups:
        assert group.kv_capacity_tokens == 0  # profiled after the other took 0.92 - weights: nothing left
        assert "cap every pool with engine.sglang.max_total_tokens" in group.reason


def test_caps_too_large_for_the_shared_gpu_leave_no_room_for_the_forwards() -> None:
    cfg = _with_engine(load_config(ROOT / "configs/device-h100x1-1p1d.yaml"), max_total_tokens=200_000)
    report = check_layout_fits(cfg, batch=[(341, 221)] * 1000, suggest=False)
    assert report.verdict == DOES_NOT_FIT
    assert all("activation headroom on the shared GPU" in g.reason for g in report.groups)
    assert "lower the max_total_tokens caps" in report.summary()


def test_a_shared_gpus_kv_budget_is_the_fraction_of_the_memory_free_before_the_weights() -> None:
    # SGLang 0.5.17 kv_cache_configurator._profile_available_bytes: budget = free at the profile - (1 - fraction) x
    # pre_model_load_memory, the memory free once the process's CUDA context is up (distributed/bootstrap.py). Started
    # together, both contexts are held before any weights: the base is the GPU less both held_before_load (1.51 GiB
    # each on an H100, the logs' "Load weight begin. avail mem=78.50 GB" of 80), not the whole GPU
    cfg = _with_engine(load_config(ROOT / "configs/device-h100x1-1p1d.yaml"), max_total_tokens=200_000)
    prefill, decode = check_layout_fits(cfg, batch=[(341, 221)] * 1000, suggest=False).groups
    from orchestrator.perfmodel.costmodel import cost_model_for

    first = cost_model_for(cfg, "decode", cfg.layout.decode[0])
    weights = 2 * first.weights_bytes_per_gpu()  # V2-Lite bf16: the logs' 29.47 GiB each
    assert first.weights_bytes_per_gpu() / 2**30 == pytest.approx(29.47, abs=0.15)
    held = 2 * 1.51 * 2**30
    # profiled after the decode server's capped pool (200k x 31,104 B) and its start-up buffers
    taken = 200_000 * 31_104 + first.runtime_overhead_bytes()
    budget = 0.92 * (80 * 2**30 - held) - weights - taken
    assert prefill.kv_gb * 1e9 == pytest.approx(budget, rel=1e-6)
    assert prefill.kv_capacity_tokens == int(budget // 31_104) < 200_000  # 0.92 x 2 x 1.51 GiB less than before
    assert decode.kv_capacity_tokens < 200_000  # and the other way round


def test_servers_on_their_own_gpus_share_nothing() -> None:
    cfg = load_config(ROOT / "configs/device-h200x2-local-1p1d.yaml")  # gpu_split auto: GPU 0 and GPU 1
    assert check_layout_fits(cfg, batch=[(341, 221)] * 1000).shared == []
    serve = check_layout_fits(load_config(ROOT / "configs/device-h100x1-qwen3-serve.yaml"))
    assert serve.verdict == FITS and len(serve.shared) == 1


def _with_engine(cfg, **sglang: object):
    data = cfg.model_dump(mode="json")
    data["engine"]["sglang"].update(sglang)
    return config_from_dict(data)


def test_a_decode_server_capped_at_256_running_holds_graph_buffers_for_256_not_the_default_512() -> None:
    """SGLang 0.5.17 resolves --cuda-graph-max-bs to 512 on an H100 at TP8 (server_args, which its mem_fraction_static
    default reserves for), but captures no graph above the scheduler's request pool (get_batch_sizes_to_capture clamps
    to req_to_token_pool.size = the running limit): the graph buffers the decode holds after start are 256's."""
    from orchestrator.perfmodel.costmodel import cost_model_for
    from orchestrator.plan.memory.defaults_text import sglang_defaults_text

    def decode(**group) -> tuple:
        data = pd_1p1d("H100-SXM", "w4a8")
        data["layout"]["decode"] = [{"tp": 8, "attention_backend": "triton", **group}]
        cfg = config_from_dict(data)
        return cfg, cost_model_for(cfg, "decode", cfg.layout.decode[0])

    cfg, capped = decode(max_running_requests=256)
    _, explicit = decode(max_running_requests=256, cuda_graph_max_bs=256)
    _, uncapped = decode()
    assert (capped.graph_max_bs, capped.captured_graph_max_bs, capped.graph_batch_sizes()[-1]) == (512, 256, 256)
    assert capped.runtime_overhead_bytes() == pytest.approx(explicit.runtime_overhead_bytes())
    assert uncapped.captured_graph_max_bs == 512 and uncapped.runtime_overhead_bytes() > capped.runtime_overhead_bytes()
    assert ("layout.decode.0: chunked_prefill_size 8192, mem_fraction_static 0.875, cuda_graph_max_bs 512 (captured "
            "to 256: the request pool, max_running_requests)") in sglang_defaults_text(cfg)


@pytest.mark.parametrize("config, sets", [
    ("configs/device-h200x2-local-1p1d.yaml", []),
    ("benchmarks/backtest/configs/h200-r1shaped-6l.yaml", R1_EAGER + ["engine.sglang.mem_fraction_static=0.80"]),
])
def test_the_fraction_a_refusal_suggests_passes_the_check_and_one_step_above_it_does_not(config, sets) -> None:
    import re

    cfg = load_config(ROOT / config, sets, paths_from=ROOT)
    batch = [(256, 128)] * 512 if sets else [(341, 221)] * 1000
    refused = next(g for g in check_layout_fits(cfg, batch=batch).groups if g.verdict == DOES_NOT_FIT)
    found = re.search(r"mem_fraction_static <= ([0-9.]+)", refused.reason)
    assert found, refused.reason
    suggested = float(found.group(1))
    verdicts = {}
    for fraction in (suggested, round(suggested + 0.01, 2)):
        data = cfg.model_dump(mode="json")
        data["layout"][refused.role][refused.index]["mem_fraction_static"] = fraction
        group = next(g for g in check_layout_fits(config_from_dict(data), batch=batch).groups if g.where == refused.where)
        verdicts[fraction] = group.verdict
    assert list(verdicts.values()) == [FITS, DOES_NOT_FIT], (refused.reason, verdicts)


# --- pipeline stages: SGLang's layer split, the heaviest stage sets every stage's KV budget -------------------------
LEASE2_PP2 = ROOT / "benchmarks/results/2026-11-26-two-gpu-lease2-h200x2/call5-calibration/calibration-twogpu-extra.json.xz"


def test_pp_stages_hold_their_own_layers_and_the_heaviest_sets_every_stages_kv_as_the_lease_logged() -> None:
    # R1's layer shape at 6 layers, PP 2 on two H200s at 0.70 (server-twogpu-pp2-tail.log in logs-twogpu-extra.tar.xz):
    # PP0 "Load weight end ... mem usage=3.59 GB" (3 dense layers + the embedding), PP1 34.11 GB (3 MoE layers + the
    # lm_head); both "#tokens: 19477729, KV size: 62.69 GB": each rank's budget from the minimum free memory over the
    # world group (get_available_gpu_memory(distributed=True)), tokens synced to the PP minimum
    import json

    from orchestrator.perfmodel.parallel.two_gpu_vs_model import server_model

    raw = json.loads(read_text(LEASE2_PP2))
    run = next(r for r in raw["runs"] if r["variant"] == "pp2-tail")
    model = server_model(run, "H200", 6)
    assert model.stage_layers() == [(3, 0), (0, 3)]
    first, last = (w / 2**30 for w in model.stage_weights_bytes())
    assert first == pytest.approx(run["derived"]["memory_usage_gb"]["weight"], abs=0.2)  # 3.45 vs 3.59
    assert last == pytest.approx(run["startup"]["weights_gb"], abs=0.2)  # 33.98 vs 34.11
    assert model.weights_bytes_per_gpu() / 2**30 == pytest.approx(last)  # the heaviest stage (an even split: 18.7)
    assert model.kv_capacity_tokens() == pytest.approx(run["startup"]["kv_cache_tokens"], rel=0.005)  # 19.50M / 19.48M
    assert model.kv_pool_bytes_per_gpu() / 2**30 == pytest.approx(run["startup"]["kv_cache_gb"], rel=0.005)


def test_r1_at_pp2_is_30_then_31_layers_and_the_last_stage_sets_weights_kv_and_the_round() -> None:
    from orchestrator.config.model_presets import DEEPSEEK_R1
    from orchestrator.perfmodel.costmodel import build_cost_model
    from orchestrator.perfmodel.parallel import pipeline

    model = build_cost_model(DEEPSEEK_R1, "H100-SXM", "fp8", tp=8, pp=2, nnodes=2)
    # 0.5.17 get_pp_indices: 61 // 2 = 30 layers each, the one left over to the last stage; layers 0-2 are dense
    assert model.stage_layers() == [(3, 27), (0, 31)]
    first, last = model.stage_weights_bytes()
    one_moe_layer = model.stage_weight_breakdown(1)["routed_experts"] / 31
    assert last - first > 3 * one_moe_layer  # 4 MoE layers more, 3 dense fewer: the even split is 2.8 GB short
    assert model.heaviest_stage() == 1 and model.weights_bytes_per_gpu() == pytest.approx(last)
    # every stage's budget is fraction x free at load - the heaviest stage's weights; the 31-layer stage sets the tokens
    budget = model.static_pool_bytes() - last
    per_layer_token = model.kv_bytes_per_gpu_token() / 61
    assert model.kv_capacity_tokens() == int(budget // (per_layer_token * 31))
    # a decode round of two micro-batches is two of the slowest stage's iterations (the 31 MoE layers + lm_head)
    stages = [model._decode_pass_s(128, 128 * 600, False, 1, k) for k in (0, 1)]
    assert stages[1] > stages[0]
    assert model.decode_step_s(256, 256 * 600) == pytest.approx(2 * (stages[1] + pipeline.iteration_s(128)))
