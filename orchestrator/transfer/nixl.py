"""NIXL in one place: the loader, the one endpoint (agent + registered memory, WRITE, notifications), and the
preflight's KV-page endpoint built on it.

sim prefill --WRITE--> sim decode  (engines/sim/kv/prefill.py, kv/decode.py): one host buffer each, asyncio
preflight prefill --WRITE--> decode (transfer/preflight.py): MLA-shaped pages in GPU or host memory, own process
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import importlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from orchestrator.transfer.layout import KvLayout, PreflightError

POISON_BYTE = 0xA5
DONE_NOTIF = b"preflight-done"
POLL_MIN_S, POLL_MAX_S = 0.0002, 0.002  # async completion polling, with backoff

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


def _address(region: Any) -> int:
    return int(region.ctypes.data) if isinstance(region, np.ndarray) else int(region.data_ptr())


class NixlEndpoint:
    """One NIXL agent (UCX backend) with registered memory regions: metadata, peers, WRITE, notifications.

    `regions`: numpy arrays (host memory) or torch tensors (host or GPU; NIXL reads their device), kept alive
    here because NIXL holds their addresses. `mem_type` is the descriptors' kind: "DRAM" or "VRAM".
    `progress_thread` stays off unless asked for: NIXL's thread busy-polls (poll timeout 0), one whole core per
    agent, which on a 2-core machine starved the simulated servers (a 1000-prompt run took 759 s instead of the
    modelled 61 s). Without it, progress is made when a transfer's state or the notifications are polled, so
    the receiving side must poll while the sender writes.
    """

    def __init__(self, name: str, regions: Sequence[Any], mem_type: str = "DRAM", progress_thread: bool = False):
        api = load_nixl_api()
        if api is None:
            raise RuntimeError(NIXL_MISSING)
        self.name = name
        self.mem_type = mem_type
        self.regions = list(regions)
        self.base = _address(self.regions[0])  # the first region's address (offsets below are into it)
        config = api.nixl_agent_config(enable_prog_thread=progress_thread, backends=["UCX"])
        self.agent = api.nixl_agent(name, config)
        if all(isinstance(r, np.ndarray) for r in self.regions):
            self.registration = self.agent.register_memory(
                [(_address(r), r.nbytes, 0, "") for r in self.regions], mem_type)
        else:
            self.registration = self.agent.register_memory(self.regions)
        self._peers: dict[str, str] = {}

    def metadata(self) -> bytes:
        return self.agent.get_agent_metadata()

    def metadata_b64(self) -> str:
        """metadata() as base64 text, for JSON handshakes."""
        return base64.b64encode(self.metadata()).decode()

    def add_peer(self, metadata: bytes, name: str | None = None) -> str:
        """Accept a peer agent (its WRITEs and notifications); its name. Known `name`s are not added again."""
        if name is not None and name in self._peers:
            return self._peers[name]
        added = self.agent.add_remote_agent(metadata)
        peer = added.decode() if isinstance(added, bytes) else str(added)  # bytes in NIXL 1.5.1, documented str
        self._peers[name or peer] = peer
        return peer

    def descs(self, rows: Any, mem_type: str | None = None):
        """Transfer descriptors for (address, bytes, device) rows (a list, or an (n, 3) uint64 array)."""
        return self.agent.get_xfer_descs(rows, mem_type or self.mem_type)

    def prepare_write(self, local: Any, remote: Any, peer: str, notif: bytes):
        """A reusable WRITE handle from local descriptors to the peer's (descs() or deserialized ones)."""
        return self.agent.initialize_xfer("WRITE", local, remote, peer, notif)

    def run_write(self, handle, notif: bytes, timeout_s: float) -> str:
        """Post the handle's WRITE and poll it to the end: 'DONE', an error state, or 'PROC' past timeout_s."""
        t0 = time.perf_counter()
        state = self.agent.transfer(handle, notif)
        while state == "PROC" and time.perf_counter() - t0 <= timeout_s:
            state = self.agent.check_xfer_state(handle)
        return state

    async def write(self, peer: str, src_offset: int, dst_addr: int, length: int, notif: bytes) -> str:
        """One WRITE of the first region's [src_offset, +length) to the peer's host address dst_addr, polled
        with backoff from the event loop (a poll progresses the UCX worker); its final state ('DONE' or an
        error state)."""
        local = self.descs([(self.base + src_offset, length, 0)])
        remote = self.descs([(dst_addr, length, 0)], "DRAM")
        handle = self.prepare_write(local, remote, peer, notif)
        try:
            state = self.agent.transfer(handle)
            pause = POLL_MIN_S
            while state == "PROC":
                await asyncio.sleep(pause)
                pause = min(pause * 2, POLL_MAX_S)
                state = self.agent.check_xfer_state(handle)
            return state
        finally:
            self.agent.release_xfer_handle(handle)

    def notifs(self) -> dict[str, list[bytes]]:
        """Notifications that arrived since the last call, by peer name."""
        return self.agent.get_new_notifs()

    def new_notifs(self) -> list[bytes]:
        return [msg for msgs in self.notifs().values() for msg in msgs]


class PreflightEndpoint:
    """One side of the preflight: a NixlEndpoint over MLA-shaped KV pages. Runs in its own process.

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
        if load_nixl_api() is None:
            raise PreflightError(NIXL_MISSING)
        size = layout.pages_per_layer * layout.page_bytes
        self.layers = [torch.empty(size, dtype=torch.uint8, device=self.device) for _ in range(layout.num_layers)]
        # the progress thread as before this endpoint shared NixlEndpoint: a preflight measures the link, once
        self.nixl = NixlEndpoint(name, self.layers, "VRAM" if memory == "gpu" else "DRAM", progress_thread=True)
        self.descs = self._page_descs(list(range(layout.pages_per_layer)))
        self.peer: str | None = None
        self.handle = None

    def info(self) -> dict:
        import socket

        where = f"{socket.gethostname()}:{self.device}"
        return {"name": self.name, "where": where, "memory": self.memory, "pid": os.getpid()}

    def metadata(self) -> bytes:
        return self.nixl.metadata()

    def _page_descs(self, page_order: list[int]):
        rows = np.zeros((self.layout.num_descriptors, 3), dtype=np.uint64)
        dev = self.device.index or 0
        i = 0
        for buf in self.layers:
            base = buf.data_ptr()
            for page in page_order:
                rows[i] = (base + page * self.layout.page_bytes, self.layout.page_bytes, dev)
                i += 1
        return self.nixl.descs(rows)

    def remote_descs(self, page_order: list[int]) -> bytes:
        """This side's descriptors in the order the peer will write them (a shuffled page mapping)."""
        return self.nixl.agent.get_serialized_descs(self._page_descs(page_order))

    # -- decode (target) side -------------------------------------------------------------------
    def add_peer(self, peer_metadata: bytes) -> str:
        return self.nixl.add_peer(peer_metadata)

    def poison(self) -> None:
        for buf in self.layers:
            buf.fill_(POISON_BYTE)
        self._sync()

    def wait_done(self, peer: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if DONE_NOTIF in self.nixl.notifs().get(peer, []):
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
        self.peer = self.nixl.add_peer(peer_metadata)
        remote = self.nixl.agent.deserialize_descs(peer_descs)
        self.handle = self.nixl.prepare_write(self.descs, remote, self.peer, DONE_NOTIF)
        return self.peer

    def write(self, iterations: int, timeout_s: float) -> dict:
        """Run the same WRITE `iterations` times (the last one notifies); seconds per transfer."""
        times = []
        for it in range(iterations):
            notif = DONE_NOTIF if it == iterations - 1 else b"preflight-%d" % it
            t0 = time.perf_counter()
            state = self.nixl.run_write(self.handle, notif, timeout_s)
            if state == "PROC":
                raise PreflightError(f"{self.name}: transfer {it} still in progress after {timeout_s:.0f}s")
            if state != "DONE":
                raise PreflightError(f"{self.name}: transfer {it} ended in state {state!r}; see the UCX log")
            times.append(time.perf_counter() - t0)
        return {"times_s": times, "backend": self.nixl.agent.query_xfer_backend(self.handle)}

    def ucx_log(self) -> str:
        sys.stdout.flush()
        try:
            return Path(self.capture_path).read_text(errors="replace")
        except OSError:
            return ""

    def _sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
