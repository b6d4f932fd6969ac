"""NIXL endpoint of the preflight: register KV-shaped memory, exchange metadata, WRITE pages, verify bytes."""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import time
from pathlib import Path
from types import ModuleType

from orchestrator.transfer.layout import KvLayout, PreflightError

POISON_BYTE = 0xA5


DONE_NOTIF = b"preflight-done"


# The `nixl` meta package re-exports one of the CUDA-flavoured wheels; either wheel alone also works.
NIXL_API_MODULES = ("nixl._api", "nixl_cu13._api", "nixl_cu12._api")
NIXL_MISSING = "NIXL is not installed: pip install nixl-cu12==1.5.1 (CPU/CUDA 12) or nixl-cu13 (CUDA 13)"


def load_nixl_api() -> ModuleType | None:
    """NIXL's Python API (nixl_agent, nixl_agent_config), the one loader for preflight, sim and benchmarks;
    None when no NIXL wheel is importable."""
    for name in NIXL_API_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


class NixlEndpoint:
    """One side of the preflight: a NIXL agent with MLA-shaped KV buffers. Runs in its own process.

    UCX prints its protocol choice (UCX_PROTO_INFO=y) on the process's stdout from C; fd 1 is redirected
    to a file for the endpoint's life so the report can say which transport moved the bytes.
    """

    def __init__(self, name: str, layout: KvLayout, env: dict[str, str], memory: str, gpu_index: int,
                 capture_path: str):
        os.environ.update(env)
        os.environ["UCX_PROTO_INFO"] = "y"
        self._capture = open(capture_path, "ab")
        os.dup2(self._capture.fileno(), 1)
        import torch

        self.torch = torch
        self.name = name
        self.layout = layout
        if memory == "auto":
            memory = "gpu" if torch.cuda.is_available() else "cpu"
        if memory == "gpu":
            if not torch.cuda.is_available():
                raise PreflightError(f"{name}: --memory gpu but torch sees no CUDA device here")
            gpu_index = min(gpu_index, torch.cuda.device_count() - 1)
            self.device = torch.device("cuda", gpu_index)
        else:
            self.device = torch.device("cpu")
        self.memory = memory
        self.capture_path = capture_path
        api = load_nixl_api()
        if api is None:
            raise PreflightError(NIXL_MISSING)
        self.agent = api.nixl_agent(name, api.nixl_agent_config(backends=["UCX"]))
        size = layout.pages_per_layer * layout.page_bytes
        self.layers = [torch.empty(size, dtype=torch.uint8, device=self.device) for _ in range(layout.num_layers)]
        self.reg = self.agent.register_memory(self.layers)
        self.descs = self._page_descs(list(range(layout.pages_per_layer)))
        self.peer: str | None = None
        self.handle = None

    def info(self) -> dict:
        import socket

        where = f"{socket.gethostname()}:{self.device}"
        return {"name": self.name, "where": where, "memory": self.memory, "pid": os.getpid()}

    def metadata(self) -> bytes:
        return self.agent.get_agent_metadata()

    def _page_descs(self, page_order: list[int]):
        import numpy as np

        rows = np.zeros((self.layout.num_descriptors, 3), dtype=np.uint64)
        dev = self.device.index or 0
        i = 0
        for buf in self.layers:
            base = buf.data_ptr()
            for page in page_order:
                rows[i] = (base + page * self.layout.page_bytes, self.layout.page_bytes, dev)
                i += 1
        return self.agent.get_xfer_descs(rows, "VRAM" if self.memory == "gpu" else "DRAM")

    def remote_descs(self, page_order: list[int]) -> bytes:
        """This side's descriptors in the order the peer will write them (a shuffled page mapping)."""
        return self.agent.get_serialized_descs(self._page_descs(page_order))

    # -- decode (target) side -------------------------------------------------------------------
    def add_peer(self, peer_metadata: bytes) -> str:
        peer = self.agent.add_remote_agent(peer_metadata)
        return peer.decode() if isinstance(peer, bytes) else peer

    def poison(self) -> None:
        for buf in self.layers:
            buf.fill_(POISON_BYTE)
        self._sync()

    def wait_done(self, peer: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            notifs = self.agent.get_new_notifs()
            if DONE_NOTIF in notifs.get(peer, []):
                return True
            time.sleep(0.001)
        return False

    def digest_in_page_order(self, page_order: list[int]) -> str:
        """sha256 of every layer's pages read in `page_order` (where the peer's page 0, 1, ... landed)."""
        self._sync()
        h = hashlib.sha256()
        idx = self.torch.tensor(page_order, device=self.device)
        for buf in self.layers:
            pages = buf.view(self.layout.pages_per_layer, self.layout.page_bytes).index_select(0, idx)
            h.update(pages.cpu().numpy().tobytes())
        return h.hexdigest()

    # -- prefill (initiator) side ---------------------------------------------------------------
    def fill(self, seed: int) -> str:
        """Random bytes in every page; returns their sha256 in natural page order."""
        gen = self.torch.Generator().manual_seed(seed)
        h = hashlib.sha256()
        for buf in self.layers:
            data = self.torch.randint(0, 256, (buf.numel(),), dtype=self.torch.uint8, generator=gen)
            buf.copy_(data.to(self.device))
            h.update(data.numpy().tobytes())
        self._sync()
        return h.hexdigest()

    def connect(self, peer_metadata: bytes, peer_descs: bytes) -> str:
        peer = self.agent.add_remote_agent(peer_metadata)
        self.peer = peer.decode() if isinstance(peer, bytes) else peer
        remote = self.agent.deserialize_descs(peer_descs)
        self.handle = self.agent.initialize_xfer("WRITE", self.descs, remote, self.peer, DONE_NOTIF)
        return self.peer

    def write(self, iterations: int, timeout_s: float) -> dict:
        """Run the same WRITE `iterations` times (the last one notifies); seconds per transfer."""
        times = []
        for it in range(iterations):
            notif = DONE_NOTIF if it == iterations - 1 else b"preflight-%d" % it
            t0 = time.perf_counter()
            state = self.agent.transfer(self.handle, notif)
            while state == "PROC":
                if time.perf_counter() - t0 > timeout_s:
                    raise PreflightError(f"{self.name}: transfer {it} still in progress after {timeout_s:.0f}s")
                state = self.agent.check_xfer_state(self.handle)
            if state != "DONE":
                raise PreflightError(f"{self.name}: transfer {it} ended in state {state!r}; see the UCX log")
            times.append(time.perf_counter() - t0)
        return {"times_s": times, "backend": self.agent.query_xfer_backend(self.handle)}

    def ucx_log(self) -> str:
        sys.stdout.flush()
        try:
            return Path(self.capture_path).read_text(errors="replace")
        except OSError:
            return ""

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
