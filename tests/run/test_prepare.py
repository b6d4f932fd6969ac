"""`pd-orchestrator prepare` and the compile-cache records behind bench's cold/warm start per engine."""

from __future__ import annotations

import json

import pytest

from orchestrator.config import config_from_dict
from orchestrator.engines.base import WorkerPlacement
from orchestrator.engines.sglang.caches import (
    CACHE_DIRS,
    cache_state,
    launch_shape,
    marker_path,
    record_warm,
    shape_id,
)
from orchestrator.engines.sglang.launch import SglangBackend
from orchestrator.run.prepare import run_prepare
from tests.support import sim_config


def sglang_config(cache_dir: str, **engine) -> object:
    return config_from_dict({
        "name": "prep",
        "cluster": {"address": "10.0.0.1:6379", "gpu": "H200", "gpus_per_node": 8, "num_nodes": 2},
        "model": {"preset": "DeepSeek-V2-Lite", "quantization": "bf16", "path": "/models/v2-lite"},
        "engine": {"kind": "sglang", "sglang": {"compile_cache_dir": cache_dir, **engine}},
        "layout": {"mode": "pd", "prefill": [{"count": 1, "tp": 1}], "decode": [{"count": 1, "tp": 1}]},
    })


def launch_of(cfg, role: str, port: int, gpu: int):
    group = getattr(cfg.layout, role)[0]
    placement = WorkerPlacement(role=role, group_index=0, replica_index=0, host="10.0.0.1",
                                advertise_host="10.0.0.1", port=port,
                                bootstrap_port=port + 1 if role == "prefill" else None,
                                gpu_ids=(gpu,), node_ip="10.0.0.1")
    return SglangBackend().build_launch(cfg, group, placement)


def test_cache_env_vars_reach_the_sglang_server_env(tmp_path):
    cfg = sglang_config(str(tmp_path / "cc"))
    launch = launch_of(cfg, "decode", 30000, 3)
    for var, sub in CACHE_DIRS.items():
        assert launch.env[var] == str(tmp_path / "cc" / sub), var
        assert (tmp_path / "cc" / sub).is_dir()
    assert "sglang.launch_server" in launch.argv
    # a user's own engine.sglang.env still wins over ours
    cfg = sglang_config(str(tmp_path / "cc"), env={"TRITON_CACHE_DIR": "/fast/triton"})
    assert launch_of(cfg, "decode", 30000, 3).env["TRITON_CACHE_DIR"] == "/fast/triton"


def test_shape_ignores_ports_gpus_and_wrapper_but_not_flags(tmp_path):
    cfg = sglang_config(str(tmp_path))
    a, b = launch_of(cfg, "decode", 30000, 0), launch_of(cfg, "decode", 31234, 5)
    assert a.argv != b.argv
    assert launch_shape(a.argv) == launch_shape(b.argv)
    assert shape_id(a.argv, "H200") == shape_id(b.argv, "H200")
    assert "--port" not in launch_shape(a.argv) and "--tp-size" in launch_shape(a.argv)
    assert shape_id(a.argv, "H200") != shape_id(a.argv, "H100-SXM")
    prefill = launch_of(cfg, "prefill", 30000, 0)
    assert shape_id(prefill.argv, "H200") != shape_id(a.argv, "H200")  # other role, other kernels
    bigger = sglang_config(str(tmp_path), extra_args=["--enable-torch-compile"])
    assert shape_id(launch_of(bigger, "decode", 30000, 0).argv, "H200") != shape_id(a.argv, "H200")
    with pytest.raises(ValueError, match="not an SGLang launch"):
        launch_shape(["python", "-m", "orchestrator.engines.sim.server"])


def test_cache_state_is_cold_until_a_server_of_the_shape_was_ready(tmp_path):
    cfg = sglang_config(str(tmp_path / "cc"))
    argv = launch_of(cfg, "decode", 30000, 0).argv
    assert cache_state(str(tmp_path / "cc"), argv, "H200") == "cold"
    path = record_warm(str(tmp_path / "cc"), argv, "H200", ready_s=149.0, sglang_version="0.5.17",
                       cache_state_before="cold")
    assert path == marker_path(str(tmp_path / "cc"), argv, "H200")
    assert json.loads(path.read_text())["ready_s"] == 149.0
    other_ports = launch_of(cfg, "decode", 39999, 7).argv
    assert cache_state(str(tmp_path / "cc"), other_ports, "H200", "0.5.17") == "warm"
    assert cache_state(str(tmp_path / "cc"), other_ports, "H200", "0.5.18") == "cold"  # SGLang upgraded
    assert cache_state(str(tmp_path / "elsewhere"), argv, "H200") == "cold"  # another node's disk


def test_prepare_with_the_sim_engine_fills_every_node_and_builds_nothing(ray_driver, tmp_path):
    cfg = sim_config({"benchmark.num_prompts": 24}, tmp_dir=tmp_path)
    report = run_prepare(cfg)
    text = report.text()
    assert report.ok, text
    assert sorted(r for n in report.nodes for r in n.roles) == ["decode", "prefill"]  # a task ran on each node
    for node in report.nodes:
        names = {c.name: c for c in node.checks}
        assert names["tokenizer"].ok and names["dataset"].ok
        assert "24 prompts sampled" in names["dataset"].detail
    assert len({n.batch_fingerprint for n in report.nodes}) == 1
    assert [c.name for c in report.compile] == ["sim engine"]
    assert "no JIT/compile caches to build" in text and text.endswith(report.text().splitlines()[-1])
    assert text.splitlines()[-1].startswith("prepared in ")


def test_prepare_refuses_a_layout_that_does_not_fit_before_touching_the_cluster(tmp_path):
    cfg = sim_config({"cluster.gpu": "H100-SXM", "model.quantization": "fp8", "engine.sim.profile": "H100-SXM"},
                     prefill=[{"count": 1, "tp": 8}], decode=[{"count": 1, "tp": 8}], tmp_dir=tmp_path)
    report = run_prepare(cfg)
    assert not report.ok and report.nodes == [] and report.compile == []
    memory = report.checks[0]
    assert memory.name == "memory" and not memory.ok
    assert "NOT prepared" in report.text()


def test_the_sglang_backend_reports_cold_then_warm_after_a_ready_server(tmp_path):
    cfg = sglang_config(str(tmp_path / "cc"))
    backend, launch = SglangBackend(), launch_of(cfg, "prefill", 30000, 2)
    assert backend.compile_cache_state(cfg, launch) == "cold"
    backend.record_ready(cfg, launch, 149.0, "cold")  # what the worker does once the server is ready
    assert backend.compile_cache_state(cfg, launch_of(cfg, "prefill", 30500, 6)) == "warm"
    assert backend.compile_cache_state(cfg, launch_of(cfg, "decode", 30000, 2)) == "cold"
    sim = sim_config()
    from orchestrator.engines.registry import backend_for

    assert backend_for(sim).compile_cache_state(sim, launch) == "n/a"  # the sim compiles nothing


def test_plan_sees_each_groups_cache_state_on_this_node(tmp_path):
    from orchestrator.engines.sglang.launch import group_cache_states

    cfg = sglang_config(str(tmp_path / "cc"))
    assert group_cache_states(cfg) == {"prefill.0": "cold", "decode.0": "cold"}
    SglangBackend().record_ready(cfg, launch_of(cfg, "decode", 31000, 4), 50.0, "cold")
    assert group_cache_states(cfg) == {"prefill.0": "cold", "decode.0": "warm"}
    assert set(group_cache_states(sim_config()).values()) == {"n/a"}
