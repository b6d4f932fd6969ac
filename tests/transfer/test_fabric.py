"""Fabric preflight: a real NIXL/UCX KV-shaped transfer between two processes (CPU memory here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import config_from_dict
from orchestrator.transfer.layout import KvLayout, PreflightError
from orchestrator.transfer.preflight import gpudirect_verdict, parse_ucx_transports, run_preflight

REPO = Path(__file__).resolve().parents[2]


def cpu_config(**over) -> dict:
    data = {
        "name": "preflight-test",
        "cluster": {"address": "local", "gpu": "cpu-fast"},
        "model": {"preset": "DeepSeek-V2-Lite"},
        "engine": {"kind": "sim"},
        "layout": {"mode": "pd", "prefill": [{"tp": 1}], "decode": [{"tp": 1}]},
        "transfer": {"ucx": {"net_devices": "lo"}},  # UCX also sees eth0; keep the test on loopback
    }
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value}
    return data


@pytest.fixture(autouse=True)
def _loopback_ucx(monkeypatch):
    monkeypatch.setenv("UCX_NET_DEVICES", "lo")


def test_kv_layout_is_one_descriptor_per_page_per_layer_of_mla_page_size():
    v2 = config_from_dict(cpu_config())
    lay = KvLayout.for_config(v2, target_bytes=4 * 2**20)
    assert lay.page_bytes == 1 * (512 + 64) * 2  # page_size x (kv_lora_rank + rope) x bf16
    assert lay.num_layers == 27
    assert lay.pages_per_layer == 4 * 2**20 // (1152 * 27)
    assert lay.num_descriptors == 27 * lay.pages_per_layer

    r1 = config_from_dict(cpu_config(model={"preset": "DeepSeek-R1"},
                                     engine={"kind": "sglang", "sglang": {"page_size": 64, "kv_cache_dtype": "fp8_e4m3"}}))
    lay = KvLayout.for_config(r1, target_bytes=64 * 2**20)
    assert (lay.page_bytes, lay.num_layers) == (64 * 576 * 1, 61)


def test_unknown_kv_dtype_is_refused_naming_the_field():
    cfg = config_from_dict(cpu_config(engine={"kind": "sglang", "sglang": {"kv_cache_dtype": "int3"}}))
    with pytest.raises(PreflightError, match=r"engine\.sglang\.kv_cache_dtype='int3'"):
        KvLayout.for_config(cfg, target_bytes=2**20)


@pytest.mark.slow
def test_cpu_preflight_moves_verified_bytes_between_two_processes(tmp_path):
    cfg = config_from_dict(cpu_config())
    report = run_preflight(cfg, target_bytes=2 * 2**20, iterations=3, work_dir=str(tmp_path))
    assert report.ok and report.bytes_verified
    assert report.mode == "local" and report.memory == "cpu"
    assert report.prefill["pid"] != report.decode["pid"] != os.getpid()
    assert report.backend == "UCX"
    assert report.iterations == 2  # the first transfer (connection set-up) is not timed
    assert report.best_gb_s >= report.median_gb_s > 0
    assert report.layout["num_descriptors"] == 27 * report.layout["pages_per_layer"]
    # UCX said which transport carried the writes toward the peer: host memory, no GPU, no RDMA here
    assert report.transports and all("host memory" in t for t in report.transports)
    assert any(t.startswith("preflight-prefill intra-node") for t in report.transports)
    assert report.gpudirect == "n/a (host memory)"
    assert report.expected_link_gb_s is None
    assert (tmp_path / "ucx-proto-info.log").stat().st_size > 0


@pytest.mark.slow
def test_preflight_command_prints_the_report_and_writes_json(tmp_path):
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps(cpu_config(transfer={"expected_link_gb_s": 10})))
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "preflight", "--config", str(cfg_path), "--mib", "1",
         "--iterations", "2", "--json", str(out), "--work-dir", str(tmp_path / "w")],
        cwd=REPO, capture_output=True, text=True, timeout=180, env={**os.environ, "UCX_NET_DEVICES": "lo"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "bytes verified: yes" in proc.stdout
    assert "expected link (host-memory): 10 GB/s" in proc.stdout
    data = json.loads(out.read_text())
    assert data["ok"] is True and data["expected_link_gb_s"] == 10


# UCX_PROTO_INFO tables as UCX 1.23 prints them (the GPU one as seen on the lent 2xH200 machine).
NVLINK_LOG = """\
[1.0] [h:1:0]   | preflight-prefill intra-node cfg#2                                        |
[1.0] [h:1:0]   | remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda/dev[3]     |
[1.0] [h:1:0]   +--------+-------------+--------------+
[1.0] [h:1:0]   | Range  | Description | Config       |
[1.0] [h:1:0]   | 0..inf | zero-copy   | cuda_ipc/cuda |
[1.0] [h:1:0]   | preflight-prefill self cfg#0                                              |
[1.0] [h:1:0]   | remote memory write by ucp_put* from cuda/GPU0 to cuda/GPU0              |
[1.0] [h:1:0]   | 0..inf | zero-copy   | cuda_copy/cuda |
"""
RDMA_LOG = """\
[2.0] [h:1:0]   | preflight-prefill inter-node cfg#1                                        |
[2.0] [h:1:0]   | remote memory write by ucp_put*(multi) from cuda/GPU0 to host           |
[2.0] [h:1:0]   | 0..inf | zero-copy   | rc_mlx5/mlx5_0:1 |
"""
STAGED_LOG = """\
[3.0] [h:1:0]   | preflight-prefill inter-node cfg#1                                        |
[3.0] [h:1:0]   | remote memory write by ucp_put*(multi) from cuda/GPU0 to host           |
[3.0] [h:1:0]   |    0..8k | copy-in     | tcp/eth0        |
[3.0] [h:1:0]   | 8k..inf | rendezvous pipeline cuda_copy | tcp/eth0 |
"""


def test_transports_are_read_from_put_tables_and_self_connections_ignored():
    assert parse_ucx_transports(NVLINK_LOG) == [
        "preflight-prefill intra-node: cuda/GPU0 to cuda/dev[3] [0..inf] zero-copy via cuda_ipc/cuda"
    ]


@pytest.mark.parametrize(
    "log, link, verdict",
    [
        (NVLINK_LOG, "nvlink", "n/a on one host: GPU-to-GPU zero-copy"),
        (RDMA_LOG, "network", "active"),
        (STAGED_LOG, "network", "NOT active"),
        ("", "network", "unknown"),
    ],
)
def test_gpudirect_verdict_tells_zero_copy_from_staging(log, link, verdict):
    assert gpudirect_verdict("gpu", link, parse_ucx_transports(log)).startswith(verdict)
