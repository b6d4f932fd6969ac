"""`pd-orchestrator preflight`: a NIXL KV-shaped transfer prefill -> decode before any engine starts.

Two endpoints (Ray actors pinned by role label to a prefill and a decode node, or two local processes
when there is no cluster) each register MLA-shaped KV memory (one buffer per layer, one descriptor per
page: page_size x (kv_lora_rank + qk_rope_head_dim) x dtype bytes), GPU memory when a GPU is there, host
memory otherwise. The prefill side WRITEs every page to a shuffled page on the decode side, as SGLang's
NIXL sender does; the decode side checks every byte. The report gives GB/s next to the link speed the
fabric should reach, and the UCX transport that actually moved the bytes (from UCX_PROTO_INFO), so a
silent fallback, e.g. GPU pages staged through host memory instead of GPUDirect RDMA, is visible.
"""

from __future__ import annotations

import multiprocessing as mp
import re
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import RunConfig
from orchestrator.transfer.layout import KvLayout, PreflightError
from orchestrator.transfer.nixl import PreflightEndpoint

# Per-direction link a prefill->decode KV write should reach, GB/s: one 400 Gb/s NIC per GPU between
# nodes (HGX H100/H200 with ConnectX-7), NVLink 4 (900 GB/s bidirectional) inside one host.
EXPECTED_LINK_GB_S = {
    ("H100-SXM", "network"): 50.0,
    ("H200", "network"): 50.0,
    ("H100-SXM", "nvlink"): 450.0,
    ("H200", "nvlink"): 450.0,
}


@dataclass
class PreflightReport:
    """What the preflight measured; `ok` means every byte arrived where it should."""

    mode: str  # "ray" or "local"
    memory: str  # "gpu" or "cpu"
    prefill: dict
    decode: dict
    layout: dict
    iterations: int
    best_gb_s: float
    median_gb_s: float
    expected_link_gb_s: float | None
    link_kind: str  # "network", "nvlink" or "host-memory"
    backend: str
    transports: list[str] = field(default_factory=list)
    gpudirect: str = "n/a"
    bytes_verified: bool = False
    ok: bool = False

    def lines(self) -> list[str]:
        lay = self.layout
        out = [
            f"NIXL preflight ({self.mode}): {self.prefill['where']} -> {self.decode['where']}, {self.memory.upper()} memory",
            f"  descriptors: {lay['num_descriptors']} = {lay['num_layers']} layers x {lay['pages_per_layer']} pages"
            f" of {lay['page_bytes']} B ({lay['total_bytes'] / 2**20:.1f} MiB per transfer)",
            f"  bandwidth: best {self.best_gb_s:.3g} GB/s, median {self.median_gb_s:.3g} GB/s over {self.iterations} transfers",
        ]
        if self.expected_link_gb_s:
            pct = 100 * self.best_gb_s / self.expected_link_gb_s
            out.append(f"  expected link ({self.link_kind}): {self.expected_link_gb_s:.3g} GB/s -> best is {pct:.0f}%")
        else:
            out.append(f"  expected link ({self.link_kind}): none configured (transfer.expected_link_gb_s)")
        out.append(f"  backend: {self.backend}; UCX transports: {', '.join(self.transports) or 'not reported'}")
        out.append(f"  GPUDirect RDMA: {self.gpudirect}")
        out.append(f"  bytes verified: {'yes' if self.bytes_verified else 'NO'}")
        return out


# ---- UCX protocol printout -> transports -----------------------------------------------------

_LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*\[[^\]]*\]\s*")
_SCOPE = re.compile(r"^\|\s*(\S+)\s+(self|intra-node|inter-node)\b[^|]*\|")
_PUT_HEADER = re.compile(r"^\|\s*remote memory write by ucp_put\S*\s+from (.+?)\s*\|")
_ROW = re.compile(r"^\|\s*(\d[\w.]*)\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|")


def parse_ucx_transports(log: str) -> list[str]:
    """One line per put (KV write) protocol UCX chose toward a peer, from UCX_PROTO_INFO=y tables.

    E.g. 'preflight-prefill intra-node: cuda/GPU0 to cuda/dev[3] [0..inf] zero-copy via cuda_ipc/cuda'.
    Tables of an agent's connection to itself ('self') are skipped: they say nothing about the link.
    """
    found: list[str] = []
    scope: str | None = None
    put: str | None = None
    for raw in log.splitlines():
        line = _LOG_PREFIX.sub("", raw).strip()
        if m := _SCOPE.match(line):
            scope = None if m.group(2) == "self" else f"{m.group(1)} {m.group(2)}"
            put = None
        elif m := _PUT_HEADER.match(line):
            put = m.group(1)
        elif line.startswith("| Range") or line.startswith("+"):
            continue
        elif (m := _ROW.match(line)) and scope and put:
            entry = f"{scope}: {put} [{m.group(1)}] {m.group(2)} via {m.group(3)}"
            if entry not in found:
                found.append(entry)
        else:
            put = None if not line.startswith("|") else put
    return found


def gpudirect_verdict(memory: str, link_kind: str, transports: list[str]) -> str:
    """Whether GPU pages went straight to the wire (or the peer GPU) or were staged, from the put rows."""
    if memory != "gpu":
        return "n/a (host memory)"
    gpu_rows = [t.lower() for t in transports if ": cuda" in t.lower()]
    if not gpu_rows:
        return "unknown (UCX reported no put from GPU memory)"
    if link_kind == "nvlink":
        if all("cuda_ipc" in r for r in gpu_rows):
            return "n/a on one host: GPU-to-GPU zero-copy over NVLink/PCIe (cuda_ipc)"
        return "NOT peer-to-peer: GPU pages staged (no cuda_ipc)"
    if all(re.search(r"zero-copy via (rc|dc|ud|ib|gga)", r) for r in gpu_rows):
        return "active (GPU pages zero-copy over the HCA)"
    return "NOT active: GPU pages staged through host memory or sent over TCP"


# ---- running the two endpoints ----------------------------------------------------------------

def _endpoint_loop(conn, kwargs: dict) -> None:
    """Child-process body for local mode: build the endpoint, then serve method calls over a pipe."""
    try:
        ep = PreflightEndpoint(**kwargs)
        conn.send(("ok", None))
    except BaseException as exc:  # reported to the parent, which raises PreflightError
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        msg = conn.recv()
        if msg is None:
            return
        method, args = msg
        try:
            conn.send(("ok", getattr(ep, method)(*args)))
        except BaseException as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class _LocalSide:
    def __init__(self, kwargs: dict):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_endpoint_loop, args=(child, kwargs), daemon=True)
        self.proc.start()
        self._answer(timeout_s=120)

    def send(self, method: str, *args) -> None:
        self.conn.send((method, args))

    def _answer(self, timeout_s: float):
        if not self.conn.poll(timeout_s):
            raise PreflightError(f"preflight endpoint pid {self.proc.pid} did not answer within {timeout_s:.0f}s")
        status, value = self.conn.recv()
        if status != "ok":
            raise PreflightError(value)
        return value

    def call(self, method: str, *args, timeout_s: float = 120):
        self.send(method, *args)
        return self._answer(timeout_s)

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()


class _NodeEndpoint(PreflightEndpoint):
    """The endpoint as a Ray actor: `where` leads with its node's address, so two hosts that share a
    hostname (containers, network namespaces) still read as two hosts."""

    def info(self) -> dict:
        import ray

        out = super().info()
        out["node_ip"] = ray.util.get_node_ip_address()
        out["where"] = f"{out['node_ip']}/{out['where']}"
        return out


class _RaySide:
    def __init__(self, kwargs: dict, label: dict[str, str], num_gpus: int):
        import ray

        self.ray = ray
        actor_cls = ray.remote(_NodeEndpoint)
        self.actor = actor_cls.options(num_cpus=0, num_gpus=num_gpus, label_selector=label).remote(**kwargs)
        self._pending = None

    def send(self, method: str, *args) -> None:
        self._pending = getattr(self.actor, method).remote(*args)

    def _answer(self, timeout_s: float):
        try:
            return self.ray.get(self._pending, timeout=timeout_s)
        except Exception as exc:
            raise PreflightError(f"preflight actor failed: {exc}") from None

    def call(self, method: str, *args, timeout_s: float = 120):
        self.send(method, *args)
        return self._answer(timeout_s)

    def close(self) -> None:
        self.ray.kill(self.actor)


def _link_kind(memory: str, same_host: bool) -> str:
    if memory != "gpu":
        return "host-memory" if same_host else "network, host memory"
    return "nvlink" if same_host else "network"


def run_preflight(cfg: RunConfig, *, target_bytes: int = 64 * 2**20, iterations: int = 5, memory: str = "auto",
                  mode: str = "auto", seed: int = 2025, timeout_s: float = 120.0,
                  work_dir: str | None = None) -> PreflightReport:
    """Move one MLA-shaped KV batch prefill -> decode `iterations` times; verify and time it."""
    from orchestrator.transfer.env import transport_env

    layout = KvLayout.for_config(cfg, target_bytes)
    env = transport_env(cfg)
    if mode == "auto":
        mode = "local" if cfg.cluster.is_local else "ray"
    work = Path(work_dir or tempfile.mkdtemp(prefix="pdo-preflight-"))
    work.mkdir(parents=True, exist_ok=True)
    common = {"layout": layout, "env": env, "memory": memory}
    roles = cfg.cluster.roles
    sides: dict[str, Any] = {}
    try:
        for role, gpu in (("decode", 1), ("prefill", 0)):
            kwargs = {**common, "name": f"preflight-{role}", "gpu_index": gpu,
                      "capture_path": str(work / f"ucx-{role}.log")}
            if mode == "local":
                sides[role] = _LocalSide(kwargs)
            else:
                import ray

                has_gpus = ray.cluster_resources().get("GPU", 0) > 0
                label = {roles.label_key: getattr(roles, role)}
                sides[role] = _RaySide(kwargs, label, num_gpus=int(memory != "cpu" and has_gpus))
        pre, dec = sides["prefill"], sides["decode"]
        pre_info, dec_info = pre.call("info"), dec.call("info")
        pages = list(range(layout.pages_per_layer))
        import random

        landing = pages[:]
        random.Random(seed).shuffle(landing)  # decode page that prefill page i lands on
        dec.call("poison")
        expected = pre.call("fill", seed)
        pre.call("connect", dec.call("metadata"), dec.call("remote_descs", landing))
        prefill_agent = dec.call("add_peer", pre.call("metadata"))  # so its notifications are accepted
        dec.send("wait_done", prefill_agent, timeout_s)
        result = pre.call("write", iterations, timeout_s, timeout_s=timeout_s * (iterations + 1))
        if not dec._answer(timeout_s + 10):
            raise PreflightError(f"decode never got the completion notification within {timeout_s:.0f}s")
        got = dec.call("digest_in_page_order", landing)
        ucx_text = pre.call("ucx_log") + "\n" + dec.call("ucx_log")
    finally:
        for side in sides.values():
            side.close()
    times = result["times_s"]
    measured = times[1:] if len(times) > 1 else times  # the first transfer pays connection set-up
    rates = [layout.total_bytes / t / 1e9 for t in measured]
    memory_used = pre_info["memory"]
    same_host = mode == "local" or pre_info["where"].split(":")[0] == dec_info["where"].split(":")[0]
    kind = _link_kind(memory_used, same_host)
    expected_gb_s = cfg.transfer.expected_link_gb_s or EXPECTED_LINK_GB_S.get((cfg.cluster.gpu, kind))
    if memory_used != "gpu" and not cfg.transfer.expected_link_gb_s:
        expected_gb_s = None
    transports = parse_ucx_transports(ucx_text)
    (work / "ucx-proto-info.log").write_text(ucx_text)
    return PreflightReport(
        mode=mode, memory=memory_used, prefill=pre_info, decode=dec_info, layout={**asdict(layout),
        "num_descriptors": layout.num_descriptors, "total_bytes": layout.total_bytes}, iterations=len(measured),
        best_gb_s=max(rates), median_gb_s=statistics.median(rates), expected_link_gb_s=expected_gb_s,
        link_kind=kind, backend=result["backend"], transports=transports,
        gpudirect=gpudirect_verdict(memory_used, kind, transports), bytes_verified=got == expected,
        ok=got == expected,
    )
