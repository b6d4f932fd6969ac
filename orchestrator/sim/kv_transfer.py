"""Prefill -> decode KV transfer of the simulated engine: real bytes, verified, through NIXL or HTTP.

decode KvReceiver -> prefill bootstrap server (GET /route, then per room: handshake, ready, data, finish)

The prefill's bootstrap server (`--disaggregation-bootstrap-port`) answers SGLang's readiness routes
(`GET /route`, `GET /health`) plus our own `/sim/kv/{room}/...` control routes. The decode drives one
room through them: handshake (its metadata, like SGLang's decode sending KV indices), `ready` (long poll
until the prefill's forward produced the first token), data, `finish` (the prefill waits the modelled
transfer time, then answers its own client). Data is the model's KV size in bytes of a seeded pattern
that depends on the room; it moves through a bounded receive buffer on the decode (slots of
`slot_bytes`), by NIXL WRITE into registered CPU memory when `nixl` is importable, else as an HTTP
stream, and every chunk is compared against the pattern.

Failure handling mirrors SGLang 0.5.17: the decode retries `GET /route` (15 x 1 s) before its handshake
fails; a heartbeat on the prefill's bootstrap `/health` (every 5 s, 2 failures) fails every room of a
dead prefill; KV that never comes fails at the waiting timeout (300 s); the decode then aborts the room
on the prefill, whose own request ends in a 500. All of these are flags of the server.
"""

from __future__ import annotations

import asyncio
import base64
import importlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import aiohttp
import numpy as np
from aiohttp import web

log = logging.getLogger(__name__)

MIB = 2**20
PATTERN_BYTES = 8 * MIB  # one pattern period; also the largest chunk moved in one piece
POLL_MIN_S, POLL_MAX_S = 0.0002, 0.002  # NIXL completion/notification polling, with backoff
_PATTERN = np.random.default_rng(2025).integers(0, 256, PATTERN_BYTES, dtype=np.uint8)
_PATTERN_TWICE = np.concatenate([_PATTERN, _PATTERN])  # any window <= PATTERN_BYTES is one slice


def expected_kv_bytes(room: int, offset: int, length: int) -> np.ndarray:
    """The bytes a room's KV holds at [offset, offset+length): a window of the pattern, shifted per room."""
    if length > PATTERN_BYTES:
        raise ValueError(f"chunk of {length} bytes exceeds the pattern period {PATTERN_BYTES}")
    start = (room * 7919 + offset) % PATTERN_BYTES
    return _PATTERN_TWICE[start : start + length]


class KvTransferError(RuntimeError):
    """A room failed. kind: 'bootstrap' (handshake never completed) or 'transfer' (KV never arrived)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class PdTimeouts:
    """SGLang's PD timeouts (defaults = SGLang 0.5.17's), in wall seconds."""

    bootstrap_retries: int = 15  # decode: GET /route attempts before the handshake fails
    bootstrap_retry_interval_s: float = 1.0
    heartbeat_interval_s: float = 5.0  # decode -> prefill bootstrap /health
    heartbeat_max_failures: int = 2
    waiting_timeout_s: float = 300.0  # decode: handshake sent -> KV complete
    bootstrap_timeout_s: float = 300.0  # prefill: request arrived -> decode handshake


def load_nixl_api() -> ModuleType | None:
    """nixl._api (the `nixl` meta package) or a CUDA-specific wheel's copy, else None."""
    for name in ("nixl._api", "nixl_cu12._api", "nixl_cu13._api"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


def resolve_transfer_mode(requested: str) -> str:
    """auto -> nixl when importable, else http; an explicit nixl without NIXL is an error."""
    if requested not in ("auto", "nixl", "http"):
        raise ValueError(f"--kv-transfer={requested!r}; allowed: auto, nixl, http")
    if requested == "http":
        return "http"
    if load_nixl_api() is not None:
        return "nixl"
    if requested == "nixl":
        raise ValueError(
            "--kv-transfer=nixl but NIXL is not importable; install the nixl extra "
            "(pip install -e '.[nixl]') or use --kv-transfer auto|http"
        )
    return "http"


class NixlEndpoint:
    """One NIXL agent (UCX backend, progress thread) with one registered CPU region."""

    def __init__(self, api: ModuleType, name: str, region: np.ndarray):
        self.api = api
        self.name = name
        self.region = region  # keep it alive: NIXL holds its address
        self.base = int(region.ctypes.data)
        self.agent = api.nixl_agent(name, api.nixl_agent_config(backends=["UCX"]))
        self.agent.register_memory([(self.base, region.nbytes, 0, "")], "DRAM")
        self._peers: dict[str, str] = {}
        self._metadata_b64 = base64.b64encode(self.agent.get_agent_metadata()).decode()

    def metadata_b64(self) -> str:
        return self._metadata_b64

    def add_peer(self, name: str, metadata_b64: str) -> str:
        if name not in self._peers:
            added = self.agent.add_remote_agent(base64.b64decode(metadata_b64))
            # add_remote_agent returns bytes in NIXL 1.5.1 although documented as str
            self._peers[name] = added.decode() if isinstance(added, bytes) else str(added)
        return self._peers[name]

    async def write(self, peer: str, src_offset: int, dst_addr: int, length: int, notif: bytes) -> None:
        """WRITE region[src_offset:+length] to the peer's dst_addr; returns when NIXL reports DONE."""
        local = self.agent.get_xfer_descs([(self.base + src_offset, length, 0)], "DRAM")
        remote = self.agent.get_xfer_descs([(dst_addr, length, 0)], "DRAM")
        handle = self.agent.initialize_xfer("WRITE", local, remote, peer, notif)
        try:
            state = self.agent.transfer(handle)
            pause = POLL_MIN_S
            while state == "PROC":  # the progress thread completes it; back off so waiting costs little CPU
                await asyncio.sleep(pause)
                pause = min(pause * 2, POLL_MAX_S)
                state = self.agent.check_xfer_state(handle)
            if state != "DONE":
                raise KvTransferError("transfer", f"NIXL WRITE to {peer} ended in state {state}")
        finally:
            self.agent.release_xfer_handle(handle)

    def new_notifs(self) -> list[bytes]:
        return [msg for msgs in self.agent.get_new_notifs().values() for msg in msgs]


# ----- prefill side ----------------------------------------------------------------------------------------
@dataclass
class KvAux:
    """SGLang's aux record: what travels with the KV besides the cache itself."""

    first_token: int
    prompt_tokens: int
    cached_tokens: int
    nbytes: int


@dataclass(eq=False)
class PrefillRoom:
    """One bootstrap room on the prefill; created by whichever arrives first, request or handshake."""

    room: int
    created_at: float = field(default_factory=time.monotonic)
    handshaken: asyncio.Event = field(default_factory=asyncio.Event)
    decode: dict[str, Any] | None = None
    kv_ready: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    data_started_at: float | None = None

    def fail(self, message: str) -> None:
        for fut in (self.kv_ready, self.done):
            if not fut.done():
                fut.set_exception(KvTransferError("transfer", message))
                fut.exception()  # mark retrieved: nobody may be waiting on both


class PrefillKvServer:
    """Prefill side: the room table and the bootstrap HTTP app (SGLang routes + /sim/kv/*)."""

    def __init__(
        self,
        server_info: Callable[[], dict[str, Any]],
        is_ready: Callable[[], bool],
        modelled_transfer_s: Callable[[int, str | None], float],
        on_transfer_done: Callable[[int, float], None],
        transfer_mode: str,
        endpoint_name: str,
    ):
        self.server_info = server_info
        self.is_ready = is_ready
        self.modelled_transfer_s = modelled_transfer_s
        self.on_transfer_done = on_transfer_done
        self.rooms: dict[int, PrefillRoom] = {}
        self.nixl: NixlEndpoint | None = None
        if transfer_mode == "nixl":
            api = load_nixl_api()
            assert api is not None  # resolve_transfer_mode checked
            self.nixl = NixlEndpoint(api, endpoint_name, _PATTERN_TWICE)

    def room(self, room: int) -> PrefillRoom:
        if room not in self.rooms:
            self.rooms[room] = PrefillRoom(room)
        return self.rooms[room]

    def drop(self, room: int) -> None:
        self.rooms.pop(room, None)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_room_failures_as_json])
        app.router.add_get("/health", self._health)
        app.router.add_get("/route", self._route)
        app.router.add_post("/sim/kv/{room}/handshake", self._handshake)
        app.router.add_get("/sim/kv/{room}/ready", self._ready)
        app.router.add_get("/sim/kv/{room}/data", self._data)
        app.router.add_post("/sim/kv/{room}/chunk", self._chunk)
        app.router.add_post("/sim/kv/{room}/finish", self._finish)
        app.router.add_post("/sim/kv/{room}/abort", self._abort)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def _route(self, request: web.Request) -> web.Response:
        if not self.is_ready():
            return web.Response(status=503, text="Prefill server not fully registered yet (0 workers registered)")
        keys = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
        missing = [k for k in keys if k not in request.query]
        if missing:
            return web.Response(status=400, text=f"Missing required query parameters: {', '.join(missing)}")
        info = self.server_info()
        if all(request.query[k] == "-1" for k in keys):
            return web.json_response(info)
        return web.json_response({"rank_ip": info["sim_host"], "rank_port": info["sim_bootstrap_port"]})

    def _room_of(self, request: web.Request) -> PrefillRoom:
        try:
            return self.room(int(request.match_info["room"]))
        except ValueError:
            raise web.HTTPBadRequest(text="bootstrap room must be an integer") from None

    async def _handshake(self, request: web.Request) -> web.Response:
        room = self._room_of(request)
        body = await request.json()
        if body.get("transfer") == "nixl":
            if self.nixl is None:
                body["transfer"] = "http"  # the peer can use NIXL, we cannot: both fall back to HTTP
            else:
                self.nixl.add_peer(body["agent_name"], body["agent_metadata"])
        room.decode = body
        room.handshaken.set()
        return web.json_response({"transfer": body.get("transfer", "http")})

    async def _ready(self, request: web.Request) -> web.Response:
        room = self._room_of(request)
        aux: KvAux = await asyncio.shield(room.kv_ready)
        if room.data_started_at is None:
            room.data_started_at = time.monotonic()
        return web.json_response(aux.__dict__)

    async def _data(self, request: web.Request) -> web.StreamResponse:
        room = self._room_of(request)
        aux: KvAux = await asyncio.shield(room.kv_ready)
        resp = web.StreamResponse(headers={"X-Kv-Bytes": str(aux.nbytes)})
        resp.content_length = aux.nbytes
        await resp.prepare(request)
        for offset in range(0, aux.nbytes, PATTERN_BYTES):
            length = min(PATTERN_BYTES, aux.nbytes - offset)
            await resp.write(expected_kv_bytes(room.room, offset, length).data)
        await resp.write_eof()
        return resp

    async def _chunk(self, request: web.Request) -> web.Response:
        room = self._room_of(request)
        body = await request.json()
        await asyncio.shield(room.kv_ready)
        assert self.nixl is not None, "chunk route is only used when both sides agreed on NIXL"
        offset, length = int(body["offset"]), int(body["length"])
        src = (room.room * 7919 + offset) % PATTERN_BYTES  # same window as expected_kv_bytes
        peer = self.nixl.add_peer(room.decode["agent_name"], room.decode["agent_metadata"])  # type: ignore[index]
        try:
            await self.nixl.write(peer, src, int(body["dst_addr"]), length, f"{room.room}:{offset}".encode())
        except Exception as exc:  # NIXL raises its own error types; the decode only needs the reason
            return web.json_response({"error": f"Prefill transfer failed: {exc}"}, status=500)
        return web.json_response({"ok": True})

    async def _finish(self, request: web.Request) -> web.Response:
        room = self._room_of(request)
        aux: KvAux = await asyncio.shield(room.kv_ready)
        node = (room.decode or {}).get("node")
        await asyncio.sleep(self.modelled_transfer_s(aux.prompt_tokens, node))
        latency_s = time.monotonic() - (room.data_started_at or room.created_at)
        if not room.done.done():
            room.done.set_result(latency_s)
            self.on_transfer_done(aux.nbytes, latency_s)
        return web.json_response(aux.__dict__)

    async def _abort(self, request: web.Request) -> web.Response:
        room = self._room_of(request)
        body = await request.json()
        room.fail(f"Prefill transfer failed for request rank=0 (bootstrap_room={room.room}): {body.get('reason')}")
        self.drop(room.room)
        return web.json_response({"ok": True})


@web.middleware
async def _room_failures_as_json(request: web.Request, handler: Callable) -> web.StreamResponse:
    """A failed room answers 500 with its reason, which the decode reports to its client."""
    try:
        return await handler(request)
    except KvTransferError as exc:
        return web.json_response({"error": str(exc)}, status=500)


# ----- decode side -----------------------------------------------------------------------------------------
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
                 verify: str = "full"):
        if verify not in VERIFY_MODES:
            raise ValueError(f"--kv-verify={verify!r}; allowed: {', '.join(VERIFY_MODES)}")
        self.verify = verify
        self.timeouts = timeouts
        self.transfer_mode = transfer_mode
        self.node = node
        self.pool = ReceivePool(buffer_bytes)
        self.nixl: NixlEndpoint | None = None
        if transfer_mode == "nixl":
            api = load_nixl_api()
            assert api is not None
            self.nixl = NixlEndpoint(api, f"sim-decode-{uuid.uuid4().hex[:12]}", self.pool.buffer)
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
            asyncio.ensure_future(self._abort_on_prefill(addr, room, str(exc) or type(exc).__name__))
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
        slot = await self.pool.acquire()
        try:
            if agreed == "nixl" and self.nixl is not None:
                await self._receive_nixl(base, room, aux.nbytes, slot)
            else:
                await self._receive_http(base, room, aux.nbytes, slot)
        finally:
            self.pool.release(slot)
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

    async def _receive_http(self, base: str, room: int, nbytes: int, slot: int) -> None:
        view = self.pool.view(slot)
        while True:
            try:
                async with self.session.get(f"{base}/data") as resp:
                    if resp.status != 200:
                        raise KvTransferError("transfer", f"KV data request failed: HTTP {resp.status}")
                    for offset in range(0, nbytes, len(view)):
                        length = min(len(view), nbytes - offset)
                        view[:length] = np.frombuffer(await resp.content.readexactly(length), dtype=np.uint8)
                        _verify(view[:length], room, offset, self.verify)
                    return
            except (aiohttp.ClientConnectionError, asyncio.IncompleteReadError):
                await asyncio.sleep(min(0.5, self.timeouts.heartbeat_interval_s / 4))

    async def _receive_nixl(self, base: str, room: int, nbytes: int, slot: int) -> None:
        assert self.nixl is not None
        view = self.pool.view(slot)
        dst = self.nixl.base + slot * self.pool.slot_bytes
        for offset in range(0, nbytes, len(view)):
            length = min(len(view), nbytes - offset)
            notif = f"{room}:{offset}".encode()
            arrived = self._expect_notif(notif)
            await self._call("POST", f"{base}/chunk", {"offset": offset, "length": length, "dst_addr": dst})
            await arrived
            _verify(view[:length], room, offset, self.verify)

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


VERIFY_MODES = ("full", "sampled")
SAMPLE_STRIDE, SAMPLE_BYTES = 4096, 64  # sampled: the first 64 bytes of every 4 KiB


def _verify(data: np.ndarray, room: int, offset: int, mode: str = "full") -> None:
    """Compare received bytes with the room's pattern: every byte, or 64 of every 4 KiB (`sampled`).

    Full comparison is the bulk of a decode's CPU when the batch is large; sampling still catches a wrong
    room, offset or missing chunk, not a single flipped byte.
    """
    expected = expected_kv_bytes(room, offset, len(data))
    if mode == "sampled" and len(data) >= SAMPLE_STRIDE:
        rows = len(data) // SAMPLE_STRIDE
        got = data[: rows * SAMPLE_STRIDE].reshape(rows, SAMPLE_STRIDE)[:, :SAMPLE_BYTES]
        want = expected[: rows * SAMPLE_STRIDE].reshape(rows, SAMPLE_STRIDE)[:, :SAMPLE_BYTES]
        same = np.array_equal(got, want) and np.array_equal(data[-SAMPLE_BYTES:], expected[-SAMPLE_BYTES:])
    else:
        words = len(data) // 8 * 8
        same = np.array_equal(data[:words].view(np.uint64), expected[:words].view(np.uint64)) and np.array_equal(
            data[words:], expected[words:]
        )
    if not same:
        bad = int(np.argmax(data != expected))
        raise KvTransferError(
            "transfer", f"KV bytes of room {room} corrupted at byte {offset + bad} (verification against pattern)"
        )
