"""Run configuration: one YAML file describes cluster, model, engine, layout, transfer, benchmark, metrics.

Pydantic models at the edge; every validation error names the field path, the bad value and what is
allowed (see `ConfigError`). Unknown keys are errors everywhere.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from orchestrator.config.benchmark import BenchmarkConfig
from orchestrator.config.layout import LayoutConfig, WorkerGroup
from orchestrator.config.model_presets import MODEL_PRESETS, ModelArchitecture
from orchestrator.config.sglang_versions import PINNED_SGLANG, installed_sglang_version
from orchestrator.config.strict import Strict
from orchestrator.records import Role

GpuType = Literal["H100-SXM", "H200", "cpu-fast"]
Quantization = Literal["bf16", "fp8", "w4a8", "awq"]


class RoleLabels(Strict):
    label_key: str = Field("role", description="Ray node label key that carries the node's role.")
    prefill: str = Field("prefill", description="Label value of prefill nodes.")
    decode: str = Field("decode", description="Label value of decode nodes.")
    aggregated: str = Field(
        "prefill", description="Label value of nodes aggregated workers start on (TP>8 spans nodes)."
    )


class LocalClusterConfig(Strict):
    num_cpus_per_node: int = Field(4, ge=1, description="Logical CPUs each local raylet advertises.")
    object_store_memory_bytes: int = Field(100 * 2**20, ge=78_643_200)
    head_port: int = Field(0, ge=0, le=65535, description="GCS port; 0 picks a free one.")
    dashboard_port: int = Field(0, ge=0, le=65535, description="Dashboard/job API port; 0 picks a free one.")
    bind_host: str = Field("127.0.0.1", description="Address local Ray services bind to.")
    gpu_split: Literal["auto", "off"] = Field(
        "auto",
        description="auto: on a machine with NVIDIA GPUs give each local raylet its own "
        "cluster.gpus_per_node of them (CUDA_VISIBLE_DEVICES; prefill node first, decode node next), so a "
        "prefill and a decode engine never share a GPU; off: every raylet sees all GPUs.",
    )


class ClusterConfig(Strict):
    address: str = Field("local", description="'local' starts a 2-node Ray cluster on this machine; else a Ray address.")
    roles: RoleLabels = RoleLabels()
    gpu: GpuType = Field("H100-SXM", description="GPU type of the (real or simulated) nodes.")
    gpu_memory_gb: float | None = Field(
        None, gt=0, description="Override of the GPU's memory; default from the GPU type."
    )
    gpus_per_node: int = Field(8, ge=1, le=16)
    num_nodes: int = Field(2, ge=1)
    single_host: bool = Field(
        False, description="Every Ray node runs on one machine (a lent multi-GPU host with one raylet per GPU): a "
        "prefill's KV reaches a decode on another node over NVLink, not over the network (the planner's KV link). "
        "False: each node is its own machine.")
    local: LocalClusterConfig = LocalClusterConfig()

    @property
    def is_local(self) -> bool:
        return self.address == "local"

    @property
    def one_machine(self) -> bool:
        """Every node on one machine (single_host, or one node): KV between any two servers moves over NVLink."""
        return self.single_host or self.num_nodes == 1


class ModelConfig(Strict):
    preset: str | None = Field("DeepSeek-R1", description=f"Named architecture: one of {sorted(MODEL_PRESETS)}.")
    path: str | None = Field(None, description="Model directory (config.json, tokenizer.json).")
    quantization: Quantization = Field("fp8", description="Weight format of the checkpoint.")
    served_model_name: str | None = None
    context_length: int | None = Field(None, ge=16)

    @model_validator(mode="after")
    def _preset_or_path(self) -> "ModelConfig":
        if self.preset is None and self.path is None:
            raise ValueError("set model.preset or model.path")
        if self.preset is not None and self.preset not in MODEL_PRESETS:
            raise ValueError(f"model.preset={self.preset!r} is unknown; allowed: {sorted(MODEL_PRESETS)}")
        return self

    @property
    def name(self) -> str:
        return self.served_model_name or self.preset or Path(self.path or "model").name

    def architecture(self) -> ModelArchitecture:
        if self.preset is not None:
            return MODEL_PRESETS[self.preset]
        assert self.path is not None, "the model validator requires preset or path"
        return ModelArchitecture.from_hf_config(Path(self.path) / "config.json")


class SimEngineConfig(Strict):
    profile: GpuType | None = Field(None, description="Cost-model GPU profile; default = cluster.gpu. 'cpu-fast' for tests.")
    efficiency_prefill: float = Field(0.45, gt=0, le=1, description="Fraction of peak FLOPs reached.")
    efficiency_decode: float = Field(
        0.8, gt=0, le=1, description="Fraction of HBM bandwidth the roofline's weight and KV reads reach (0.8: the rate the "
        "GPUs' measured fixed costs were split against; routed experts go at their kernel's measured share).")
    startup_s: float | None = Field(
        None, ge=0, description="Simulated engine start-up delay; default from the cost model."
    )
    time_scale: float = Field(1.0, gt=0, description="Multiply every simulated duration (tests < 1).")
    kv_transfer: Literal["auto", "nixl", "http"] = Field(
        "auto", description="How simulated KV bytes move: NIXL on CPU memory when installed, else HTTP."
    )
    kv_payload: Literal["sample", "full"] = Field(
        "sample",
        description="KV bytes really moved per request: a verified, checksummed sample (the first kv_sample_bytes; "
        "the modelled transfer time still charges the whole KV) or all of them ('full', for transfer tests: "
        "1000 ShareGPT prompts of R1 are ~21 GB, more than a 2-core machine copies in the modelled time).",
    )
    kv_sample_bytes: int = Field(1 << 20, ge=1, description="Bytes moved per request with kv_payload: sample.")
    faults: dict[str, Any] = Field(
        default_factory=dict, description="Fault injection per role, see orchestrator/engines/sim/faults.py."
    )


class SglangEngineConfig(Strict):
    python: str = Field("python3", description="Interpreter that has sglang installed.")
    version: str = Field(default_factory=installed_sglang_version, pattern=r"^\d+\.\d+\.\d+$", description="SGLang "
                         "release the servers run: plan and the simulator apply its defaults (config/sglang_versions.py); "
                         f"default: the installed sglang, else {PINNED_SGLANG}.")
    load_format: str | None = Field("dummy", description="--load-format; null = real weights.")
    page_size: int = Field(1, ge=1, description="--page-size, equal on both roles.")
    kv_cache_dtype: str = Field("auto", description="--kv-cache-dtype, equal on both roles.")
    attention_backend: str | None = None
    mem_fraction_static: float | None = Field(None, gt=0, lt=1)
    max_total_tokens: int | None = Field(None, ge=1, description="--max-total-tokens: cap of every server's KV pool "
                                         "(tokens); null = what mem_fraction_static leaves after the weights.")
    triton_attention_split_tile_size: int | None = Field(
        None, ge=1, description="--triton-attention-split-tile-size: the triton decode splits KV into "
        "context_length / this many parts (sizes its per-step fp32 buffers); null = SGLang's split count.")
    extra_args: list[str] = Field(default_factory=list, description="Passed to every server.")
    env: dict[str, str] = Field(default_factory=dict)
    disk_read_gb_s: float = Field(2.0, gt=0, description="Weight read speed of the nodes (real weights).")
    startup_timeout_s: float | None = Field(
        None, gt=0, description="Seconds each server may take to become ready; null = the start-up budget from plan's "
        "predicted time to ready (plan/closedloop/startup_budget.py), as the serve+goodput job's walltime.")
    compile_cache_dir: str = Field(
        "~/.cache/pd-orchestrator/compile",
        description="Persistent directory on every node for SGLang's JIT/compile caches (Triton, DeepGEMM, "
        "FlashInfer, CUDA); `pd-orchestrator prepare` fills it for the run's shapes, bench records cold/warm.",
    )
    bind_dist_store: bool = Field(
        True,
        description="Host torch.distributed's rendezvous store in a wrapper that listens on the server's --host "
        "only (SGLang's own store listens on every interface). Single-node servers with dp=1 or dp_attention.",
    )


class EngineConfig(Strict):
    kind: Literal["sim", "sglang"] = "sim"
    sim: SimEngineConfig = SimEngineConfig()
    sglang: SglangEngineConfig = SglangEngineConfig()
    bind_host: str | None = Field(
        None,
        description="Address engine servers (HTTP API, PD bootstrap) listen on in a multi-node cluster; "
        "default: the address peers reach them at (transfer.host_ip or the Ray node IP). '0.0.0.0' listens "
        "on all interfaces. A local cluster always uses cluster.local.bind_host.",
    )
    allow_from: list[str] = Field(
        default_factory=list,
        description="Hosts that may connect to the engines' HTTP API and PD bootstrap ports (others get no answer): "
        "IPv4 addresses/networks and 'cluster' = every Ray node's address (the gateway's and workers' hosts); loopback "
        "always; list a monitoring host too. Empty: any host. Enforced by the simulated engine (SGLang: not yet).",
    )

    @model_validator(mode="after")
    def _allow_list_enforceable(self) -> "EngineConfig":
        for entry in self.allow_from:
            if entry != "cluster":
                try:
                    ipaddress.IPv4Network(entry, strict=False)
                except ValueError:
                    raise ValueError(f"allow_from: {entry!r} is not an IPv4 address or network (e.g. 10.1.0.7 or "
                                     "10.1.0.0/24) nor 'cluster'") from None
        if self.allow_from and self.kind == "sglang":
            raise ValueError("allow_from is enforced by the simulated engine only so far; for SGLang restrict the "
                             "workers' ports with the hosts' firewall and leave allow_from empty")
        return self


class UcxConfig(Strict):
    tls: str | None = Field(None, description="UCX_TLS, e.g. 'rc,cuda_copy,cuda_ipc,gdr_copy,tcp'.")
    net_devices: str | None = Field(
        None, description="UCX_NET_DEVICES, e.g. 'mlx5_0:1,mlx5_1:1'; default: 'lo' on a local (one-machine) "
        "cluster, UCX's own choice elsewhere."
    )
    ib_gpu_direct_rdma: Literal["yes", "no", "try"] | None = Field(
        None, description="UCX_IB_GPU_DIRECT_RDMA; 'yes' fails loudly instead of staging."
    )
    rndv_scheme: str | None = Field(None, description="UCX_RNDV_SCHEME.")
    rndv_thresh: str | None = Field(None, description="UCX_RNDV_THRESH.")
    max_rma_rails: int | None = Field(None, ge=1)
    extra: dict[str, str] = Field(default_factory=dict, description="More UCX_* variables.")


class NcclConfig(Strict):
    ib_hca: str | None = Field(None, description="NCCL_IB_HCA listing only InfiniBand HCAs.")
    net_gdr_level: str | None = Field(None, description="NCCL_NET_GDR_LEVEL, e.g. 'PHB' or 'SYS'.")
    ib_gid_index: int | None = Field(None, ge=0, description="NCCL_IB_GID_INDEX (RoCE).")
    socket_ifname: str | None = Field(None, description="NCCL_SOCKET_IFNAME.")
    extra: dict[str, str] = Field(default_factory=dict, description="More NCCL_* variables.")


class TransferConfig(Strict):
    backend: Literal["nixl"] = "nixl"
    nixl_backend: str = Field("UCX", description="SGLANG_DISAGGREGATION_NIXL_BACKEND.")
    nixl_backend_params: dict[str, str] = Field(default_factory=dict)
    bootstrap_port: int = Field(8998, ge=1, le=65535, description="Prefill bootstrap port (base).")
    host_ip: str | None = Field(
        None, description="SGLANG_HOST_IP; default = the Ray node IP of each worker."
    )
    expected_link_gb_s: float | None = Field(
        None, gt=0, description="Link speed the fabric preflight compares against."
    )
    ucx: UcxConfig = UcxConfig()
    nccl: NcclConfig = NcclConfig()
    env: dict[str, str] = Field(default_factory=dict, description="Any other environment variables.")


class RouterConfig(Strict):
    policy: Literal["round_robin", "least_outstanding", "least_tokens", "power_of_two", "prefix_aware", "random"] = Field(
        "prefix_aware", description="Pairing policy (docs/router.md): how the router picks the prefill and "
        "the decode of each request; prefix_aware measured best (docs/performance.md, Pairing policies); random = "
        "sglang-router's PD pairing as the organisers' 2026 deployment ran it.")
    seed: int = Field(0, description="Seed of the policies that draw (random, power_of_two; one stream per role), "
                      "in the router and in the planner's simulated router, so a run or a plan can be repeated.")
    host: str = Field("127.0.0.1", description="HTTP ingress bind address (loopback by default). The router runs on "
                      "the node with this address; for a wildcard or loopback address, on the driver's node.")
    port: int = Field(8000, ge=1, le=65535)
    api_key_env: str | None = Field(None, description="Env var holding the ingress API key, if any.")
    max_prompt_tokens: int = Field(131072, ge=1)
    request_timeout_s: float | None = Field(None, gt=0, description="Per-leg timeout; default = deadline left.")
    max_attempts: int = Field(2, ge=1, le=10)
    max_in_flight_requests: int | None = Field(
        None, ge=1, description="Inference requests (/generate, /v1/completions, /v1/chat/completions) the gateway "
        "holds at once; past it a request is answered 503 with the reason and counted in "
        "pdorch_requests_rejected_total. None: no limit.")


class MetricsConfig(Strict):
    exporter_host: str = Field("127.0.0.1", description="Bind address of our Prometheus exporters.")
    exporter_port: int = Field(9464, ge=0, le=65535, description="0 picks a free port.")
    file_sd_path: str = Field("runs/prometheus_targets.json")
    prometheus_url: str | None = Field(None, description="Prometheus the live view and checks query.")
    prometheus_port: int = Field(9090, ge=1, le=65535, description="Port of `monitor up`'s Prometheus.")
    grafana_url: str | None = None
    scrape_interval_s: float = Field(1.0, gt=0)


class RunConfig(Strict):
    name: str = Field("run", description="Run name, used in run ids and metric labels.")
    rules: str | None = Field(
        None, description="Competition rules profile the run must comply with (orchestrator/rules/profiles/<name>.yaml "
        "or a path), e.g. apac-hpcai-2025; plan, bench and the report state the verdict."
    )
    cluster: ClusterConfig = ClusterConfig()
    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    layout: LayoutConfig
    transfer: TransferConfig = TransferConfig()
    benchmark: BenchmarkConfig = BenchmarkConfig()
    router: RouterConfig = RouterConfig()
    metrics: MetricsConfig = MetricsConfig()

    @model_validator(mode="after")
    def _layout_fits_cluster_shape(self) -> "RunConfig":
        for role, i, g in self.layout.groups():
            per_node = g.gpus_per_node
            if per_node > self.cluster.gpus_per_node:
                raise ValueError(
                    f"layout.{role}.{i}: one server needs {g.gpus_per_server} GPUs over {g.nnodes} node(s) "
                    f"= {per_node}/node, but cluster.gpus_per_node={self.cluster.gpus_per_node}; "
                    f"raise nnodes or lower tp/dp"
                )
            if g.nnodes > self.cluster.num_nodes:
                raise ValueError(
                    f"layout.{role}.{i}.nnodes={g.nnodes} exceeds cluster.num_nodes={self.cluster.num_nodes}"
                )
            if (g.attention_backend or self.engine.sglang.attention_backend) == "flashmla" and self.engine.sglang.page_size != 64:
                raise ValueError(
                    f"layout.{role}.{i}: attention_backend flashmla runs with page size 64 (SGLang forces it); "
                    f"set engine.sglang.page_size: 64"
                )
        if self.layout.mode == "pd":
            algorithms = {None if g.speculative is None else g.speculative.algorithm for _, _, g in self.layout.groups()}
            if len(algorithms) > 1:
                raise ValueError(
                    "layout.*.speculative: PD prefill and decode servers must run the same speculative algorithm "
                    "(prefill hands decode the MTP draft's hidden states); set it on every group or on none"
                )
        return self

    def node_role(self, role: Role, group: WorkerGroup) -> str:
        return group.node_role or getattr(self.cluster.roles, role)

    @property
    def sim_profile(self) -> str:
        return self.engine.sim.profile or self.cluster.gpu

    @property
    def simulated(self) -> bool:
        """Whether the engines are simulated (results are labelled SIMULATED)."""
        return self.engine.kind == "sim"

    @property
    def time_scale(self) -> float:
        """Wall seconds per reported second: the sim's engine.sim.time_scale, 1 for real engines."""
        return self.engine.sim.time_scale if self.simulated else 1.0


