"""Transport environment from the `transfer` config: UCX/NCCL/NIXL variables, the same for engines and the preflight."""

from __future__ import annotations

from orchestrator.config import RunConfig


def _prefixed(prefix: str, extra: dict[str, str]) -> dict[str, str]:
    return {(k if k.startswith(prefix) else prefix + k): str(v) for k, v in extra.items()}


def transport_env(cfg: RunConfig) -> dict[str, str]:
    """UCX/NCCL/NIXL variables from `transfer`: the same for engines and for the fabric preflight."""
    t = cfg.transfer
    # one machine: KV moves over cuda_ipc, so UCX needs no network device, and without this its listeners
    # bind the host's address (seen on 2xH200: 10 ports per prefill server beyond loopback)
    net_devices = t.ucx.net_devices or ("lo" if cfg.cluster.is_local else None)
    ucx = {
        "UCX_TLS": t.ucx.tls,
        "UCX_NET_DEVICES": net_devices,
        "UCX_IB_GPU_DIRECT_RDMA": t.ucx.ib_gpu_direct_rdma,
        "UCX_RNDV_SCHEME": t.ucx.rndv_scheme,
        "UCX_RNDV_THRESH": t.ucx.rndv_thresh,
        "UCX_MAX_RMA_RAILS": None if t.ucx.max_rma_rails is None else str(t.ucx.max_rma_rails),
    }
    nccl = {
        "NCCL_IB_HCA": t.nccl.ib_hca,
        "NCCL_NET_GDR_LEVEL": t.nccl.net_gdr_level,
        "NCCL_IB_GID_INDEX": None if t.nccl.ib_gid_index is None else str(t.nccl.ib_gid_index),
        "NCCL_SOCKET_IFNAME": t.nccl.socket_ifname,
    }
    env = {k: v for k, v in {**ucx, **nccl}.items() if v is not None}
    env.update(_prefixed("UCX_", t.ucx.extra))
    env.update(_prefixed("NCCL_", t.nccl.extra))
    env.update(t.env)
    return env
