"""Decode side of the simulated KV transfer: bootstrap check, per-room handshake, receive and verify the bytes."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from orchestrator.engines.base import PdTimeouts
from orchestrator.engines.sim.kv.prefill import KvAux
from orchestrator.engines.sim.kv.transfer import PATTERN_BYTES, VERIFY_MODES, KvTransferError, PayloadCheck, log
from orchestrator.transfer.nixl import POLL_MAX_S, POLL_MIN_S, NixlEndpoint


class ReceivePool:
    """The decode's bounded receive buffer: `slots` slots of `slot_bytes`, one per in-flight transfer."""

    def __init__(self, buffer_bytes: int, slot_bytes: int = PATTERN_BYTES):
        slot_bytes = min(slot_bytes, PATTERN_BYTES, buffer_bytes)
        self.slot_bytes = slot_bytes
        self.buffer = np.zeros(max(1, buffer_bytes // slot_bytes) * slot_bytes, dtype=np.uint8)
        self._free: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(self.buffer) // slot_bytes):
            self._free.put_nowait(i)

    async def acquire(self) -> int:
        return await self._free.get()

    def release(self, slot: int) -> None:
        self._free.put_nowait(slot)

    def view(self, slot: int) -> np.ndarray:
        return self.buffer[slot * self.slot_bytes : (slot + 1) * self.slot_bytes]


@dataclass
class _PrefillWatch:
    """Heartbeat state of one prefill bootstrap address, shared by all its rooms on this decode."""

    lost: asyncio.Event = field(default_factory=asyncio.Event)
    active_rooms: int = 0
    task: asyncio.Task | None = None


class KvReceiver:
    """Decode side: bootstrap check, heartbeat, and the per-room handshake/ready/data/finish sequence."""

    def __init__(self, timeouts: PdTimeouts, transfer_mode: str, node: str, buffer_bytes: int,
                 verify: str = "full", kv_layout: tuple[int, str] = (1, "auto")):
        """`kv_layout`: this decode's (--page-size, --kv-cache-dtype), which the prefill's must equal."""
        if verify not in VERIFY_MODES:
            raise ValueError(f"--kv-verify={verify!r}; allowed: {', '.join(VERIFY_MODES)}")
        self.verify = verify
        self.page_size, self.kv_cache_dtype = kv_layout
        self.verified_transfers = 0  # rooms whose payload passed the pattern check and the checksum
        self.received_bytes = 0
        self.timeouts = timeouts
        self.transfer_mode = transfer_mode
        self.node = node
        self.pool = ReceivePool(buffer_bytes)
        self._aborts: set[asyncio.Task] = set()  # held until done: the loop keeps only weak references to tasks
        self.nixl: NixlEndpoint | None = None
        if transfer_mode == "nixl":  # resolve_transfer_mode checked that NIXL loads
            self.nixl = NixlEndpoint(f"sim-decode-{uuid.uuid4().hex[:12]}", [self.pool.buffer])
        self._prefill_info: dict[str, dict[str, Any]] = {}
        self._watches: dict[str, _PrefillWatch] = {}
        self._notif_waiters: dict[bytes, asyncio.Future] = {}
        self._early_notifs: set[bytes] = set()
        self._notif_task: asyncio.Task | None = None
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        for w in self._watches.values():
            if w.task:
                w.task.cancel()
        if self._notif_task:
            self._notif_task.cancel()
        if self._session:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def connect(self, addr: str, room: int) -> dict[str, Any]:
        """GET /route until the prefill is registered (SGLang's _ensure_prefill_info), cached per address."""
        if addr in self._prefill_info:
            return self._prefill_info[addr]
        t = self.timeouts
        url = f"{addr}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
        last = "no attempt"
        for attempt in range(t.bootstrap_retries):
            try:
                timeout = aiohttp.ClientTimeout(total=max(1.0, t.bootstrap_retry_interval_s * 2))
                async with self.session.get(url, timeout=timeout) as resp:
                    if resp.status == 200:
                        info = await resp.json()
                        self._check_layout(info, room)
                        self._prefill_info[addr] = info
                        return info
                    last = f"HTTP {resp.status}: {(await resp.text())[:200]}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt + 1 < t.bootstrap_retries:
                await asyncio.sleep(t.bootstrap_retry_interval_s)
        raise KvTransferError(
            "bootstrap",
            f"Decode handshake failed for request rank=0 with exception KVTransferError(bootstrap_room={room}): "
            f"Could not fetch prefill parallel info from {addr} after {t.bootstrap_retries} attempts ({last})",
        )

    def _check_layout(self, info: dict[str, Any], room: int) -> None:
        """SGLang 0.5.17's sanity checks of the prefill's info (disaggregation/common/conn.py): equal page size and
        KV cache dtype, else the KV could not be read."""
        theirs, ours = (info.get("page_size"), info.get("kv_cache_dtype")), (self.page_size, self.kv_cache_dtype)
        for (name, flag), prefill, decode in zip((("page_size", "--page-size"), ("kv_cache_dtype", "--kv-cache-dtype")),
                                                 theirs, ours):
            if prefill is not None and prefill != decode:
                what = "Page size" if name == "page_size" else "KV cache dtype"
                raise KvTransferError("bootstrap", (
                    f"{what} mismatch: prefill server has {name}={prefill}, but decode server has {name}={decode}. "
                    f"Both servers must use the same {flag} value. (bootstrap_room={room})"))

    async def fetch(self, addr: str, room: int, rid: str) -> KvAux:
        """Handshake, wait for the KV, move and verify it, finish; bounded by the waiting timeout."""
        watch = self._watch(addr)
        watch.active_rooms += 1
        lost = asyncio.ensure_future(watch.lost.wait())
        work = asyncio.ensure_future(self._fetch(addr, room, rid))
        try:
            done, _ = await asyncio.wait({work, lost}, timeout=self.timeouts.waiting_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if work in done:
                return work.result()  # raises the transfer's own error
            reason = (
                "Lost connection with prefill instance" if lost in done
                else f"Request timed out after {self.timeouts.waiting_timeout_s:g} s waiting for KV"
            )
            raise KvTransferError(
                "transfer",
                f"Decode transfer failed for request rank=0 with exception KVTransferError(bootstrap_room={room}): "
                f"{reason} {addr}",
            )
        except BaseException as exc:
            work.cancel()
            abort = asyncio.ensure_future(self._abort_on_prefill(addr, room, str(exc) or type(exc).__name__))
            self._aborts.add(abort)
            abort.add_done_callback(self._aborts.discard)
            raise
        finally:
            lost.cancel()
            watch.active_rooms -= 1

    async def _fetch(self, addr: str, room: int, rid: str) -> KvAux:
        base = f"{addr}/sim/kv/{room}"
        hello: dict[str, Any] = {"rid": rid, "transfer": self.transfer_mode, "node": self.node}
        if self.nixl is not None:
            hello.update(agent_name=self.nixl.name, agent_metadata=self.nixl.metadata_b64())
        agreed = (await self._call("POST", f"{base}/handshake", hello))["transfer"]
        aux = KvAux(**await self._call("GET", f"{base}/ready"))
        check = PayloadCheck(room, self.verify)
        slot = await self.pool.acquire()
        try:
            if agreed == "nixl" and self.nixl is not None:
                await self._receive_nixl(base, room, aux.moved_bytes, slot, check)
            else:
                await self._receive_http(base, room, aux.moved_bytes, slot, check)
        finally:
            self.pool.release(slot)
        check.finish(aux.moved_bytes, aux.checksum)
        self.verified_transfers += 1
        self.received_bytes += aux.moved_bytes
        await self._call("POST", f"{base}/finish", {})
        return aux

    async def _call(self, method: str, url: str, body: dict | None = None) -> dict[str, Any]:
        """One control call; connection errors are retried until the heartbeat or the timeout decides."""
        while True:
            try:
                async with self.session.request(method, url, json=body) as resp:
                    text = await resp.text()
                    if resp.status != 200:
                        try:
                            text = json.loads(text).get("error", text)
                        except (ValueError, AttributeError):
                            pass
                        raise KvTransferError("transfer", f"{url.rsplit('/', 1)[-1]}: HTTP {resp.status}: {text}")
                    return json.loads(text)
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(min(0.5, self.timeouts.heartbeat_interval_s / 4))

    async def _receive_http(self, base: str, room: int, nbytes: int, slot: int, check: PayloadCheck) -> None:
        view = self.pool.view(slot)
        while True:
            try:
                async with self.session.get(f"{base}/data") as resp:
                    if resp.status != 200:
                        raise KvTransferError("transfer", f"KV data request failed: HTTP {resp.status}")
                    check.reset()
                    for offset in range(0, nbytes, len(view)):
                        length = min(len(view), nbytes - offset)
                        view[:length] = np.frombuffer(await resp.content.readexactly(length), dtype=np.uint8)
                        check.chunk(view[:length], offset)
                    return
            except (aiohttp.ClientConnectionError, asyncio.IncompleteReadError):
                await asyncio.sleep(min(0.5, self.timeouts.heartbeat_interval_s / 4))

    async def _receive_nixl(self, base: str, room: int, nbytes: int, slot: int, check: PayloadCheck) -> None:
        assert self.nixl is not None
        view = self.pool.view(slot)
        dst = self.nixl.base + slot * self.pool.slot_bytes
        for offset in range(0, nbytes, len(view)):
            length = min(len(view), nbytes - offset)
            notif = f"{room}:{offset}".encode()
            arrived = self._expect_notif(notif)
            await self._call("POST", f"{base}/chunk", {"offset": offset, "length": length, "dst_addr": dst})
            await arrived
            check.chunk(view[:length], offset)

    def _expect_notif(self, msg: bytes) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        if msg in self._early_notifs:
            self._early_notifs.discard(msg)
            fut.set_result(None)
            return fut
        self._notif_waiters[msg] = fut
        if self._notif_task is None or self._notif_task.done():
            self._notif_task = asyncio.ensure_future(self._poll_notifs())
        return fut

    async def _poll_notifs(self) -> None:
        assert self.nixl is not None
        pause = POLL_MIN_S
        while self._notif_waiters:
            notifs = self.nixl.new_notifs()
            for msg in notifs:
                fut = self._notif_waiters.pop(msg, None)
                if fut is None:
                    self._early_notifs.add(msg)
                elif not fut.done():
                    fut.set_result(None)
            pause = POLL_MIN_S if notifs else min(pause * 2, POLL_MAX_S)
            await asyncio.sleep(pause)

    def _watch(self, addr: str) -> _PrefillWatch:
        watch = self._watches.get(addr)
        if watch is None or watch.lost.is_set():
            watch = self._watches[addr] = _PrefillWatch()
        if watch.task is None or watch.task.done():
            watch.task = asyncio.ensure_future(self._heartbeat(addr, watch))
        return watch

    async def _heartbeat(self, addr: str, watch: _PrefillWatch) -> None:
        """GET {addr}/health every interval while rooms are active; max failures in a row = prefill lost."""
        t = self.timeouts
        failures = 0
        while True:
            await asyncio.sleep(t.heartbeat_interval_s)
            if watch.active_rooms == 0:
                watch.task = None
                return
            try:
                timeout = aiohttp.ClientTimeout(total=t.heartbeat_interval_s)
                async with self.session.get(f"{addr}/health", timeout=timeout) as resp:
                    failures = 0 if resp.status == 200 else failures + 1
            except (aiohttp.ClientError, asyncio.TimeoutError):
                failures += 1
            if failures >= t.heartbeat_max_failures:
                log.warning("Lost connection with prefill instance %s after %d heartbeat failures", addr, failures)
                self._prefill_info.pop(addr, None)  # SGLang clears its connection pool on heartbeat failure
                watch.lost.set()
                return

    async def _abort_on_prefill(self, addr: str, room: int, reason: str) -> None:
        """Tell the prefill to fail the room (SGLang's decode sends ABORT over ZMQ); best effort."""
        try:
            timeout = aiohttp.ClientTimeout(total=2.0)
            async with self.session.post(f"{addr}/sim/kv/{room}/abort", json={"reason": reason},
                                         timeout=timeout):
                pass
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass
