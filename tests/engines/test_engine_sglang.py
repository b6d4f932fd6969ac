"""SglangBackend: exact launch_server argv and env for the shipped 2-node layouts, readiness on real HTTP."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.engines.base import EngineStartTimeout, WorkerPlacement
from orchestrator.engines.registry import backend_for
from orchestrator.engines.sglang.caches import CACHE_DIRS
from orchestrator.engines.sglang.launch import (
    DIST_STORE_WRAPPER,
    SglangBackend,
    SglangLaunchError,
    readiness_urls,
    startup_time,
    wait_ready,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PREFILL_IP, DECODE_IP = "10.0.0.1", "10.0.0.2"

# The transport environment every shipped 2x8 config asks for (InfiniBand, GPUDirect RDMA enforced).
IB_ENV = {
    "UCX_TLS": "rc,cuda_copy,cuda_ipc,gdr_copy,tcp",
    "UCX_IB_GPU_DIRECT_RDMA": "yes",
    "NCCL_IB_HCA": "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7",
    "NCCL_NET_GDR_LEVEL": "SYS",
}


def common_env(ip: str, visible: str = "0,1,2,3,4,5,6,7") -> dict[str, str]:
    return {
        "CUDA_VISIBLE_DEVICES": visible,
        "SGLANG_HOST_IP": ip,
        "SGLANG_DISAGGREGATION_NIXL_BACKEND": "UCX",
        "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS": "{}",
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "105",  # 420 s deadline / 4
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "105",
        "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "5",
        "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
        "PYTHONUNBUFFERED": "1",
        **IB_ENV,
        # compile caches in engine.sglang.compile_cache_dir's default, one subdirectory per cache
        **{var: str(Path.home() / ".cache/pd-orchestrator/compile" / sub) for var, sub in CACHE_DIRS.items()},
    }


def server_argv(host: str, port: int, tp: int, base_gpu: int, role: str | None, bootstrap: int = 8998,
                quantization: str | None = None) -> list[str]:
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "deepseek-ai/DeepSeek-R1"]
    if quantization:  # the TP4-prefill presets use a W4A8 checkpoint (FP8 R1 does not fit 4 H200s)
        argv += ["--quantization", quantization]
    argv += ["--host", host, "--port", str(port), "--load-format", "dummy",  # then the ServerSpec's flags
             "--tp-size", str(tp), "--pp-size", "1", "--dp-size", "1", "--ep-size", "1",
             "--kv-cache-dtype", "auto", "--page-size", "1"]
    if role:
        argv += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", "nixl"]
    argv += ["--base-gpu-id", str(base_gpu)]
    if role:
        argv += ["--disaggregation-bootstrap-port", str(bootstrap)]
    return argv + ["--enable-metrics"]


def under_dist_store(argv: list[str], host: str = "0.0.0.0") -> list[str]:
    """A single-node server runs under dist_store.py, which keeps torch's store on the server's --host."""
    return [argv[0], str(DIST_STORE_WRAPPER), "--host", host, "--", *argv]


def placement(role: str, ip: str, port: int, gpus: range, bootstrap: int | None = None, **kw) -> WorkerPlacement:
    return WorkerPlacement(role=role, group_index=0, replica_index=kw.pop("replica", 0), host="0.0.0.0",
                           advertise_host=ip, port=port, bootstrap_port=bootstrap, gpu_ids=tuple(gpus),
                           node_ip=ip, **kw)


def test_backend_for_sglang_config_is_the_sglang_backend():
    cfg = load_config(CONFIGS / "h200-1p1d-tp8.yaml")
    assert isinstance(backend_for(cfg), SglangBackend)


def test_1p1d_tp8_prefill_and_decode_on_their_own_nodes():
    cfg = load_config(CONFIGS / "h200-1p1d-tp8.yaml")
    backend = SglangBackend()
    pre = backend.build_launch(cfg, cfg.layout.prefill[0], placement("prefill", PREFILL_IP, 30000, range(8), 8998))
    dec = backend.build_launch(cfg, cfg.layout.decode[0], placement("decode", DECODE_IP, 30001, range(8)))

    assert pre.argv == under_dist_store(server_argv("0.0.0.0", 30000, 8, 0, "prefill"))
    assert dec.argv == under_dist_store(server_argv("0.0.0.0", 30001, 8, 0, "decode"))
    assert pre.env == common_env(PREFILL_IP)
    assert dec.env == common_env(DECODE_IP)
    assert pre.url == f"http://{PREFILL_IP}:30000" and pre.bootstrap_port == 8998
    assert dec.bootstrap_port is None


def test_2p1d_two_tp4_prefills_share_a_node_on_disjoint_gpus_and_bootstrap_ports():
    cfg = load_config(CONFIGS / "h200-2p1d-tp4.yaml")
    backend = SglangBackend()
    group = cfg.layout.prefill[0]
    p0 = backend.build_launch(cfg, group, placement("prefill", PREFILL_IP, 30000, range(0, 4), 8998))
    p1 = backend.build_launch(cfg, group, placement("prefill", PREFILL_IP, 30002, range(4, 8), 8999, replica=1))
    dec = backend.build_launch(cfg, cfg.layout.decode[0], placement("decode", DECODE_IP, 30001, range(8)))

    assert p0.argv == under_dist_store(server_argv("0.0.0.0", 30000, 4, 0, "prefill", 8998, "w4afp8"))
    assert p1.argv == under_dist_store(server_argv("0.0.0.0", 30002, 4, 4, "prefill", 8999, "w4afp8"))
    assert dec.argv == under_dist_store(server_argv("0.0.0.0", 30001, 8, 0, "decode", quantization="w4afp8"))
    assert p0.env == p1.env == common_env(PREFILL_IP)
    assert dec.env == common_env(DECODE_IP)
    assert readiness_urls(p1) == [
        f"http://{PREFILL_IP}:30002/health",
        f"http://{PREFILL_IP}:8999/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1",
    ]
    assert readiness_urls(dec) == [f"http://{DECODE_IP}:30001/health"]


def test_1p_tp4_with_1d_tp8_keeps_page_size_and_kv_dtype_equal_on_both_roles():
    cfg = load_config(CONFIGS / "h200-1p1d-tp4-tp8.yaml", ["engine.sglang.page_size=64",
                                                         "engine.sglang.kv_cache_dtype=fp8_e4m3"])
    backend = SglangBackend()
    pre = backend.build_launch(cfg, cfg.layout.prefill[0], placement("prefill", PREFILL_IP, 30000, range(4), 8998))
    dec = backend.build_launch(cfg, cfg.layout.decode[0], placement("decode", DECODE_IP, 30001, range(8)))

    def swap_kv(argv):
        i = argv.index("--kv-cache-dtype")
        return argv[:i] + ["--kv-cache-dtype", "fp8_e4m3", "--page-size", "64"] + argv[i + 4:]

    assert pre.argv == under_dist_store(swap_kv(server_argv("0.0.0.0", 30000, 4, 0, "prefill", quantization="w4afp8")))
    assert dec.argv == under_dist_store(swap_kv(server_argv("0.0.0.0", 30001, 8, 0, "decode", quantization="w4afp8")))
    assert pre.env == common_env(PREFILL_IP) and dec.env == common_env(DECODE_IP)


def test_aggregated_tp16_spans_two_nodes_with_one_launch_per_node_rank():
    cfg = load_config(CONFIGS / "h200-agg-tp16.yaml")
    backend = SglangBackend()
    group = cfg.layout.aggregated[0]
    dist = f"{PREFILL_IP}:5000"
    ranks = [
        backend.build_launch(cfg, group, placement("aggregated", ip, 30000, range(8), nnodes=2, node_rank=r,
                                                   dist_init_addr=dist))
        for r, ip in enumerate((PREFILL_IP, DECODE_IP))
    ]
    for r, launch in enumerate(ranks):
        expected = server_argv("0.0.0.0", 30000, 16, 0, None)
        expected[expected.index("--kv-cache-dtype"):expected.index("--kv-cache-dtype")] = ["--nnodes", "2"]
        i = expected.index("--base-gpu-id")
        expected[i:i] = ["--node-rank", str(r), "--dist-init-addr", dist]
        assert launch.argv == expected
        assert launch.env == common_env((PREFILL_IP, DECODE_IP)[r])
    assert readiness_urls(ranks[0]) == [f"http://{PREFILL_IP}:30000/health"]
    assert readiness_urls(ranks[1]) == []  # only node rank 0 serves HTTP


def test_transfer_and_engine_settings_reach_argv_and_env_with_engine_env_last():
    cfg = load_config(CONFIGS / "h200-1p1d-tp8.yaml", [
        "model.path=/models/dsv2lite", "model.quantization=w4a8", "model.context_length=16384",
        "engine.sglang.python=/opt/py/bin/python3", "engine.sglang.attention_backend=triton",
        "engine.sglang.mem_fraction_static=0.85", "engine.sglang.extra_args=[--sampling-backend, pytorch]",
        "layout.decode.0.max_running_requests=256", "layout.decode.0.cuda_graph_max_bs=256",
        "layout.decode.0.dp=8", "layout.decode.0.dp_attention=true", "layout.decode.0.ep=8",
        "transfer.host_ip=192.168.1.9", "transfer.nixl_backend_params={device_list: mlx5_0}",
        "transfer.ucx.rndv_scheme=put_zcopy", "transfer.ucx.max_rma_rails=4", "transfer.ucx.extra={LOG_LEVEL: info}",
        "transfer.nccl.ib_gid_index=3", "transfer.nccl.extra={NCCL_DEBUG: WARN}",
        "transfer.env={NCCL_NVLS_ENABLE: '0'}", "engine.sglang.env={CUDA_VISIBLE_DEVICES: '0,1', NCCL_NVLS_ENABLE: '1'}",
        "benchmark.deadline_s=60",
    ])
    dec = SglangBackend().build_launch(cfg, cfg.layout.decode[0], placement("decode", DECODE_IP, 30001, range(8)))
    assert dec.argv == under_dist_store([
        "/opt/py/bin/python3", "-m", "sglang.launch_server", "--model-path", "/models/dsv2lite",
        "--quantization", "w4afp8", "--context-length", "16384", "--host", "0.0.0.0", "--port", "30001",
        "--load-format", "dummy", "--attention-backend", "triton",
        "--tp-size", "8", "--pp-size", "1", "--dp-size", "8", "--ep-size", "8", "--enable-dp-attention",
        "--mem-fraction-static", "0.85", "--kv-cache-dtype", "auto", "--page-size", "1",
        "--max-running-requests", "256", "--cuda-graph-max-bs-decode", "256",
        "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl",
        "--base-gpu-id", "0", "--disaggregation-bootstrap-port", "8998",
        "--enable-metrics", "--sampling-backend", "pytorch",
    ])
    assert dec.env == {
        **common_env("192.168.1.9", visible="0,1"),
        "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS": '{"device_list": "mlx5_0"}',
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "30",  # floor: 60 s / 4 is too short for a real transfer
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "30",
        "UCX_RNDV_SCHEME": "put_zcopy", "UCX_MAX_RMA_RAILS": "4", "UCX_LOG_LEVEL": "info",
        "NCCL_IB_GID_INDEX": "3", "NCCL_DEBUG": "WARN", "NCCL_NVLS_ENABLE": "1",
    }


@pytest.mark.parametrize(
    "overrides, why",
    [
        (["engine.sglang.bind_dist_store=false"], "turned off"),
        (["layout.decode.0.tp=4", "layout.decode.0.dp=2"], "dp=2 without dp_attention runs two torch worlds"),
        (["layout.decode.0.extra_args=[--nccl-port, '29600']"], "the flags name the rendezvous port themselves"),
    ],
)
def test_servers_that_must_keep_sglangs_own_store_are_not_wrapped(overrides, why):
    cfg = load_config(CONFIGS / "h200-1p1d-tp8.yaml", overrides)
    dec = SglangBackend().build_launch(cfg, cfg.layout.decode[0], placement("decode", DECODE_IP, 30001, range(8)))
    assert dec.argv[1:3] == ["-m", "sglang.launch_server"], why


@pytest.mark.parametrize(
    "gpus, fix",
    [(range(4), "needs 8 per node"), ((0, 1, 2, 3, 5, 6, 7, 8), "not contiguous"), ((), "needs 8 per node")],
)
def test_wrong_gpu_assignment_is_refused_with_the_fix(gpus, fix):
    cfg = load_config(CONFIGS / "h200-1p1d-tp8.yaml")
    with pytest.raises(SglangLaunchError, match=fix):
        SglangBackend().build_launch(cfg, cfg.layout.prefill[0], placement("prefill", PREFILL_IP, 1, gpus, 8998))


def test_multi_node_server_without_dist_init_addr_is_refused():
    cfg = load_config(CONFIGS / "h200-agg-tp16.yaml")
    with pytest.raises(SglangLaunchError, match="dist_init_addr"):
        SglangBackend().build_launch(cfg, cfg.layout.aggregated[0],
                                     placement("aggregated", PREFILL_IP, 1, range(8), nnodes=2))


class _FakeSglang(BaseHTTPRequestHandler):
    """Stands in for the HTTP face of a starting prefill: health first, bootstrap registration later."""

    registered = threading.Event()

    def do_GET(self):  # http.server names it so
        if self.path == "/health":
            code, body = 200, b""
        elif self.path.startswith("/route?") and self.registered.is_set():
            code, body = 200, b"{}"
        elif self.path == "/server_info":  # SGLang builds without startup_time reporting answer like this
            code, body = 200, b'{"internal_states": [{"last_gen_throughput": 0.0}]}'
        else:
            code, body = 503, b""
            self.registered.set()  # the next /route poll finds every rank registered
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_prefill_is_ready_only_when_health_and_bootstrap_route_answer(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeSglang)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        cfg = load_config(CONFIGS / "h200-1p1d-tp8.yaml")
        p = WorkerPlacement(role="prefill", group_index=0, replica_index=0, host="127.0.0.1",
                            advertise_host="127.0.0.1", port=port, bootstrap_port=port, gpu_ids=tuple(range(8)))
        launch = SglangBackend().build_launch(cfg, cfg.layout.prefill[0], p)
        assert not _FakeSglang.registered.is_set()
        wait_ready(launch, timeout_s=30, poll_s=0.05)
        assert _FakeSglang.registered.is_set()  # the first /route poll was refused, a later one passed
        assert startup_time(launch.url) == {}  # absent -> {} (the device scripts log it), not a KeyError
    finally:
        server.shutdown()
        server.server_close()


def test_wait_ready_names_the_url_that_never_answered():
    cfg = load_config(CONFIGS / "h200-1p1d-tp8.yaml")
    p = WorkerPlacement(role="decode", group_index=0, replica_index=0, host="127.0.0.1", advertise_host="127.0.0.1",
                        port=1, gpu_ids=tuple(range(8)))
    launch = SglangBackend().build_launch(cfg, cfg.layout.decode[0], p)
    # a timeout, not a failed start: the worker answers it with the one line naming its budget and phase
    with pytest.raises(EngineStartTimeout, match=r"http://127\.0\.0\.1:1/health"):
        wait_ready(launch, timeout_s=0.3, poll_s=0.05)


@pytest.mark.parametrize(
    ("address", "net_devices", "expected"),
    [("local", None, "lo"), ("local", "mlx5_0:1", "mlx5_0:1"), ("10.0.0.1:6379", None, None)],
    ids=["local-cluster-keeps-ucx-on-loopback", "configured-devices-win", "real-cluster-lets-ucx-choose"],
)
def test_ucx_stays_on_loopback_on_a_one_machine_cluster(address, net_devices, expected):
    from orchestrator.transfer.env import transport_env

    sets = [f"cluster.address={address}"] + ([f"transfer.ucx.net_devices={net_devices}"] if net_devices else [])
    cfg = load_config(CONFIGS / "device-h200x2-1p1d.yaml", sets)
    assert transport_env(cfg).get("UCX_NET_DEVICES") == expected
