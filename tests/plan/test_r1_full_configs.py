"""Issue 17's configs (DeepSeek-R1 at full size on one 8xH200 host): they load, the planner says they fit, and
each produces the SGLang command line its device run needs (benchmarks/device_r1_full.sh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.config.model_presets import DEEPSEEK_R1, ModelArchitecture
from orchestrator.engines.base import WorkerPlacement
from orchestrator.engines.sglang.launch import SglangBackend
from orchestrator.plan.memory.preflight import check_layout_fits
from orchestrator.plan.memory.report import FITS, LITTLE_KV

ROOT = Path(__file__).resolve().parents[2]
AGG = "configs/h200-r1-agg-tp8.yaml"
DPATTN = "configs/h200-r1-agg-tp8-dpattn.yaml"
PD_W4A8 = "configs/h200-r1-pd-4p4d-w4a8.yaml"
PD_L38 = "configs/h200-r1-pd-4p4d-fp8-l38.yaml"
ALL = [AGG, DPATTN, PD_W4A8, PD_L38]


def _cfg(path: str):
    return load_config(ROOT / path)


def _argv(cfg, role: str) -> list[str]:
    """The launch argv of the first server of `role`, placed on the GPUs the local cluster gives it."""
    group = getattr(cfg.layout, role)[0]
    first = 4 if role == "decode" else 0  # gpu_split: the decode raylet holds GPUs 4-7 of the host
    placement = WorkerPlacement(
        role=role, group_index=0, replica_index=0, host="127.0.0.1", advertise_host="127.0.0.1", port=30000,
        bootstrap_port=8998 if role == "prefill" else None,
        gpu_ids=tuple(range(first, first + group.gpus_per_server)), node_ip="127.0.0.1",
    )
    return SglangBackend().build_launch(cfg, group, placement).argv


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize("path", ALL)
def test_each_config_fits_one_8_gpu_host_per_the_planner(path):
    cfg = _cfg(path)
    report = check_layout_fits(cfg, suggest=False)
    # runs (little KV queues, it does not stop): the FP8 38-layer fallback's decode at 0.75 holds 210,888 tokens since
    # the pool is a fraction of the memory free at weight load, under half the 1000-request batch's ~508,000
    assert report.verdict in (FITS, LITTLE_KV), report.summary()
    gpus = sum(g.count * g.gpus_per_server for _, _, g in cfg.layout.groups())
    assert gpus == 8 and cfg.cluster.gpu == "H200" and cfg.cluster.is_local
    assert all(g.nnodes == 1 for _, _, g in cfg.layout.groups())  # each server on one raylet
    assert cfg.engine.kind == "sglang" and cfg.engine.sglang.load_format == "dummy"
    assert (cfg.benchmark.num_prompts, cfg.benchmark.seed) == (1000, 2025)


@pytest.mark.parametrize("path", ALL)
def test_the_model_directory_is_the_architecture_the_planner_plans(path):
    """SGLang reads model.path's config.json; the planner the preset (or that file): they must be one model."""
    cfg = _cfg(path)
    on_disk = ModelArchitecture.from_hf_config(ROOT / cfg.model.path / "config.json")
    planned = cfg.model.architecture()
    fields = ("hidden_size", "num_hidden_layers", "first_k_dense_replace", "n_routed_experts", "num_experts_per_tok",
              "num_attention_heads", "kv_lora_rank", "q_lora_rank", "moe_intermediate_size", "vocab_size")
    assert {f: getattr(on_disk, f) for f in fields} == {f: getattr(planned, f) for f in fields}
    expected_layers = 38 if path == PD_L38 else DEEPSEEK_R1.num_hidden_layers
    assert on_disk.num_hidden_layers == expected_layers
    quant = json.loads((ROOT / cfg.model.path / "config.json").read_text())["quantization_config"]
    # SGLang 0.5.17 refuses --quantization w4afp8 against a config.json that says fp8 (model_config.py)
    assert quant["quant_method"] == ("w4afp8" if cfg.model.quantization == "w4a8" else "fp8")
    assert quant["weight_block_size"] == [128, 128]


def test_aggregated_tp8_argv_takes_all_eight_gpus_without_pd_or_quantization_flags():
    cfg = _cfg(AGG)
    argv = _argv(cfg, "aggregated")
    assert (_flag(argv, "--tp-size"), _flag(argv, "--dp-size"), _flag(argv, "--ep-size")) == ("8", "1", "1")
    assert _flag(argv, "--base-gpu-id") == "0" and "--nnodes" not in argv
    assert "--enable-dp-attention" not in argv and "--disaggregation-mode" not in argv
    assert "--quantization" not in argv  # FP8 comes from the checkpoint's own config.json
    assert _flag(argv, "--load-format") == "dummy" and _flag(argv, "--attention-backend") == "triton"
    assert _flag(argv, "--mem-fraction-static") == "0.85"
    assert _flag(argv, "--model-path") == "models/deepseek-r1"
    env = SglangBackend().build_launch(cfg, cfg.layout.aggregated[0], WorkerPlacement(
        role="aggregated", group_index=0, replica_index=0, host="127.0.0.1", advertise_host="127.0.0.1",
        port=30000, gpu_ids=tuple(range(8)))).env
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" and env["NCCL_NVLS_ENABLE"] == "0"


def test_dp_attention_argv_runs_attention_eight_ways_on_the_same_eight_gpus():
    cfg = _cfg(DPATTN)
    group = cfg.layout.aggregated[0]
    assert group.gpus_per_server == 8
    argv = _argv(cfg, "aggregated")
    assert "--enable-dp-attention" in argv
    assert (_flag(argv, "--tp-size"), _flag(argv, "--dp-size")) == ("8", "8")
    assert _flag(argv, "--mem-fraction-static") == "0.72"
    # the only layout difference from run 1a is DP-attention
    base = _argv(_cfg(AGG), "aggregated")
    differ = {a for a in set(argv) ^ set(base) if a.startswith("--")}
    assert differ == {"--enable-dp-attention"}


@pytest.mark.parametrize("path,quant_flag", [(PD_W4A8, "w4afp8"), (PD_L38, None)])
def test_pd_argv_one_tp4_server_per_raylet_with_nixl(path, quant_flag):
    cfg = _cfg(path)
    assert cfg.cluster.gpus_per_node == 4 and cfg.cluster.num_nodes == 2
    assert cfg.cluster.local.gpu_split == "auto"  # prefill raylet GPUs 0-3, decode raylet GPUs 4-7
    for role, base_gpu in (("prefill", "0"), ("decode", "4")):
        argv = _argv(cfg, role)
        assert _flag(argv, "--disaggregation-mode") == role
        assert _flag(argv, "--disaggregation-transfer-backend") == "nixl"
        assert _flag(argv, "--tp-size") == "4" and "--nnodes" not in argv
        assert _flag(argv, "--base-gpu-id") == base_gpu
        assert _flag(argv, "--quantization") == quant_flag
    assert _flag(_argv(cfg, "decode"), "--mem-fraction-static") == "0.75"
    assert "--disable-prefill-cuda-graph" in _argv(cfg, "prefill")


def test_the_device_script_runs_exactly_these_configs():
    script = (ROOT / "benchmarks/device_r1_full.sh").read_text()
    for path in ALL:
        assert path in script
    assert "--prefill-gpu" in script and "orchestrator.calibrate pd" in script


def test_predictions_were_committed_for_every_config():
    pred = ROOT / "benchmarks/results/2026-11-24-r1-full-predictions"
    for path in ALL:
        name = Path(path).stem
        for mode in ("warm", "cold"):
            text = (pred / f"{name}.{mode}.txt").read_text()
            assert f"plan: {name} " in text and "memory: fits" in text
