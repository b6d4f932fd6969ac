"""Real SGLang backend: config + placement -> `python -m sglang.launch_server` argv (the ServerSpec's flags), env
and readiness URLs.

GPU choice (why it is done this way): on a host that runs both a prefill and a decode server, NIXL's UCX
backend moves KV with `cuda_ipc` only when each process can see the peer's GPU. So every server sees the
whole node's GPUs (`CUDA_VISIBLE_DEVICES=0..gpus_per_node-1`, overriding the per-replica value Ray sets) and
`--base-gpu-id` points at the first *physical* id Ray assigned to the replica (`ray.get_gpu_ids()`). This
is the layout that ran on the lent 2xH200 machine (/work/shared/gpu/REPORT.md). `engine.sglang.env`
may set CUDA_VISIBLE_DEVICES itself (e.g. one host split into two Ray "nodes" of one GPU each).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from orchestrator.config import RunConfig, WorkerGroup
from orchestrator.config.server_spec import ServerSpec, server_spec
from orchestrator.engines.base import (
    EngineBackend,
    EngineLaunch,
    EngineProcess,
    EngineStartTimeout,
    PdTimeouts,
    WorkerPlacement,
)
from orchestrator.engines.sglang.caches import cache_env, cache_state, record_warm, sglang_version
from orchestrator.transfer.env import transport_env

# Checkpoint each preset stands for when model.path is not set (only config.json is read with dummy weights).
PRESET_MODEL_IDS = {"DeepSeek-R1": "deepseek-ai/DeepSeek-R1", "DeepSeek-V2-Lite": "deepseek-ai/DeepSeek-V2-Lite"}
# model.quantization -> --quantization; fp8/bf16 come from the checkpoint's own config.json.
QUANTIZATION_FLAGS = {"w4a8": "w4afp8", "awq": "awq"}

DIST_STORE_WRAPPER = Path(__file__).with_name("dist_store.py")
BOOTSTRAP_ROUTE_QUERY = "prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"


class SglangLaunchError(ValueError):
    """A config/placement combination no SGLang server can be launched from; the message says the fix."""


def model_path(cfg: RunConfig) -> str:
    if cfg.model.path:
        return cfg.model.path
    if cfg.model.preset in PRESET_MODEL_IDS:
        return PRESET_MODEL_IDS[cfg.model.preset]
    raise SglangLaunchError(
        f"model.path is not set and model.preset={cfg.model.preset!r} has no known checkpoint; "
        "set model.path to a directory with config.json and the tokenizer (e.g. models/deepseek-v2-lite)"
    )


def _gpu_flags(cfg: RunConfig, group: WorkerGroup, placement: WorkerPlacement) -> tuple[list[str], str]:
    """--base-gpu-id and the CUDA_VISIBLE_DEVICES that makes Ray's physical ids valid inside the server."""
    ids = sorted(placement.gpu_ids)
    per_node = group.gpus_per_node
    where = f"{placement.role}-{placement.group_index}/{placement.replica_index}"
    if len(ids) != per_node:
        raise SglangLaunchError(
            f"{where}: Ray assigned GPUs {ids} but one server of layout.{placement.role}.{placement.group_index} "
            f"needs {per_node} per node (tp={group.tp}, dp={group.dp}, nnodes={group.nnodes}); "
            "request num_gpus equal to that per replica"
        )
    if ids != list(range(ids[0], ids[0] + len(ids))):
        raise SglangLaunchError(
            f"{where}: GPUs {ids} are not contiguous; SGLang places TP ranks at --base-gpu-id + rank, "
            "so the replica needs a contiguous block (pack servers of equal size per node)"
        )
    visible = ",".join(str(i) for i in range(max(cfg.cluster.gpus_per_node, ids[-1] + 1)))
    return ["--base-gpu-id", str(ids[0])], visible


def build_argv(cfg: RunConfig, group: WorkerGroup, placement: WorkerPlacement, spec: ServerSpec | None = None) -> list[str]:
    """The exact `launch_server` command line for one server (one node of it when nnodes > 1): the model, where it
    listens, the ServerSpec's flags (`spec`, default: the group's), the node rank, GPUs, bootstrap port, metrics,
    then extra_args (flags of no typed field: a repeat of one is a config error)."""
    eng = cfg.engine.sglang
    spec = spec or server_spec(cfg, placement.role, group)
    argv = [eng.python, "-m", "sglang.launch_server", "--model-path", model_path(cfg)]
    if cfg.model.served_model_name:
        argv += ["--served-model-name", cfg.model.served_model_name]
    if cfg.model.quantization in QUANTIZATION_FLAGS:
        argv += ["--quantization", QUANTIZATION_FLAGS[cfg.model.quantization]]
    if cfg.model.context_length:
        argv += ["--context-length", str(cfg.model.context_length)]
    argv += ["--host", placement.host, "--port", str(placement.port)]
    argv += spec.to_sglang_argv()
    if group.nnodes > 1:
        if not placement.dist_init_addr:
            raise SglangLaunchError(
                f"{placement.role}-{placement.group_index}: nnodes={group.nnodes} needs placement.dist_init_addr "
                "(host:port of node rank 0 for torch.distributed)"
            )
        argv += ["--node-rank", str(placement.node_rank), "--dist-init-addr", placement.dist_init_addr]
    gpu_argv, _ = _gpu_flags(cfg, group, placement)
    argv += gpu_argv
    if placement.role != "aggregated":
        argv += ["--disaggregation-bootstrap-port", str(_bootstrap_port(cfg, placement))]
    argv.append("--enable-metrics")
    return argv + list(group.extra_args) + list(eng.extra_args)


def wraps_dist_store(cfg: RunConfig, group: WorkerGroup, argv: list[str]) -> bool:
    """Whether the server runs under dist_store.py (torch's rendezvous store on the server's --host only).

    Not for servers spanning nodes (the store must be reached from the other nodes at --dist-init-addr), nor
    for dp > 1 without dp_attention (SGLang runs dp separate torch worlds, which cannot share one store),
    nor when the flags already name a rendezvous address.
    """
    return (
        cfg.engine.sglang.bind_dist_store
        and group.nnodes == 1
        and (group.dp == 1 or group.dp_attention)
        and not {"--dist-init-addr", "--nccl-port"} & set(argv)
    )


def _bootstrap_port(cfg: RunConfig, placement: WorkerPlacement) -> int:
    # On decode the flag is only the default for requests that carry no bootstrap_port; our router always
    # sends one, so the base port is fine there.
    return placement.bootstrap_port or cfg.transfer.bootstrap_port


def build_env(cfg: RunConfig, group: WorkerGroup, placement: WorkerPlacement,
              timeouts: PdTimeouts | None = None) -> dict[str, str]:
    """Environment for one server: routable IP, NIXL/UCX/NCCL transport, PD timeouts (the ServerSpec's, which
    SGLang reads from these variables), GPU visibility."""
    t = cfg.transfer
    _, visible = _gpu_flags(cfg, group, placement)
    timeouts = timeouts or server_spec(cfg, placement.role, group).pd.timeouts
    env: dict[str, str] = {
        "CUDA_VISIBLE_DEVICES": visible,
        "SGLANG_HOST_IP": t.host_ip or placement.node_ip,
        "SGLANG_DISAGGREGATION_NIXL_BACKEND": t.nixl_backend,
        "SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS": json.dumps(t.nixl_backend_params, sort_keys=True),
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": str(int(timeouts.waiting_timeout_s)),
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": str(int(timeouts.bootstrap_timeout_s)),
        "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": str(int(timeouts.heartbeat_interval_s)),
        "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": str(timeouts.heartbeat_max_failures),
        "PYTHONUNBUFFERED": "1",
    }
    env.update(transport_env(cfg))
    env.update(cache_env(cfg.engine.sglang.compile_cache_dir))  # compile caches persist per node (caches.py)
    env.update(cfg.engine.sglang.env)
    return env


def readiness_urls(launch: EngineLaunch) -> list[str]:
    """URLs that must all answer 200 before the server takes traffic ([] for node ranks > 0: no HTTP).

    Prefill adds its bootstrap `/route` query with every rank -1: 200 only once all its ranks registered.
    """
    if launch.node_rank != 0:
        return []
    urls = [launch.url + "/health"]
    if launch.role == "prefill" and launch.bootstrap_url:
        urls.append(launch.bootstrap_url + "/route?" + BOOTSTRAP_ROUTE_QUERY)
    return urls


def wait_ready(launch: EngineLaunch, timeout_s: float, poll_s: float = 1.0) -> None:
    """Poll every readiness URL until all answer 200; raise EngineStartTimeout naming the ones that did not."""
    pending = readiness_urls(launch)
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while pending:
            still = []
            for url in pending:
                try:
                    if client.get(url).status_code != 200:
                        still.append(url)
                except httpx.HTTPError:
                    still.append(url)
            pending = still
            if pending and time.monotonic() > deadline:
                raise EngineStartTimeout(f"not ready after {timeout_s:.0f}s: {', '.join(pending)}")
            if pending:
                time.sleep(poll_s)


def startup_time(url: str, timeout_s: float = 10.0) -> dict:
    """`/server_info`'s startup_time (load_weight, kv_cache_allocation, cuda_graph, ...), {} if absent."""
    info = httpx.get(url + "/server_info", timeout=timeout_s).json()
    return info.get("startup_time") or {}


class SglangBackend(EngineBackend):
    """Engine backend that launches real `sglang.launch_server` processes (one per node rank)."""

    name = "sglang"

    def build_launch(self, cfg: RunConfig, group: WorkerGroup, placement: WorkerPlacement) -> EngineLaunch:
        spec = self.server_spec(cfg, placement.role, group)
        argv = build_argv(cfg, group, placement, spec)
        if wraps_dist_store(cfg, group, argv):
            argv = [cfg.engine.sglang.python, str(DIST_STORE_WRAPPER), "--host", placement.host, "--", *argv]
        env = build_env(cfg, group, placement, spec.pd.timeouts)
        url = f"http://{placement.advertise_host}:{placement.port}"
        bootstrap = _bootstrap_port(cfg, placement) if placement.role == "prefill" else None
        return EngineLaunch(
            argv=argv, env=env, url=url, role=placement.role, node_rank=placement.node_rank,
            bootstrap_port=bootstrap,
            bootstrap_url=f"http://{placement.advertise_host}:{bootstrap}" if bootstrap else None,
        )

    def rank_processes(self, group: WorkerGroup) -> int:
        return group.nnodes - 1  # SGLang runs one process per node of a multi-node server

    def wait_ready(self, process: EngineProcess, timeout_s: float) -> None:
        """/health, and on a prefill its bootstrap server's /route, which answers 200 once every rank registered."""
        process.wait_healthy(timeout_s)
        wait_ready(process.launch, timeout_s)

    def compile_cache_state(self, cfg: RunConfig, launch: EngineLaunch) -> str:
        eng = cfg.engine.sglang
        return cache_state(eng.compile_cache_dir, launch.argv, cfg.cluster.gpu, sglang_version(eng.python))

    def record_ready(self, cfg: RunConfig, launch: EngineLaunch, ready_s: float | None, cache_state: str) -> None:
        eng = cfg.engine.sglang
        record_warm(eng.compile_cache_dir, launch.argv, cfg.cluster.gpu, ready_s, sglang_version(eng.python),
                    cache_state)


def group_cache_states(cfg) -> dict[str, str]:
    """'<role>.<index>' -> warm | cold for each worker group of a real SGLang config, judged by this node's cache
    directory (where `plan` runs; on a cluster `prepare` reports every node); 'n/a' for engines without caches."""
    if cfg.engine.kind != "sglang":
        return {f"{role}.{i}": "n/a" for role, i, _ in cfg.layout.groups()}
    eng = cfg.engine.sglang
    version = sglang_version(eng.python)
    states: dict[str, str] = {}
    for role, i, group in cfg.layout.groups():
        per_node = group.gpus_per_node
        placement = WorkerPlacement(  # ports, hosts and GPU ids are not part of the shape
            role=role, group_index=i, replica_index=0, host="127.0.0.1", advertise_host="127.0.0.1", port=1,
            bootstrap_port=2 if role == "prefill" else None, gpu_ids=tuple(range(per_node)), nnodes=group.nnodes,
            dist_init_addr="127.0.0.1:3" if group.nnodes > 1 else None,
        )
        launch = SglangBackend().build_launch(cfg, group, placement)
        states[f"{role}.{i}"] = cache_state(eng.compile_cache_dir, launch.argv, cfg.cluster.gpu, version)
    return states
