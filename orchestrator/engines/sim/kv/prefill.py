"""Prefill side of the simulated KV transfer: the bootstrap server and per-room senders (NIXL or TCP)."""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from aiohttp import web

from orchestrator.engines.sim.kv.transfer import PATTERN_TWICE, PATTERN_BYTES, KvTransferError, expected_kv_bytes
from orchestrator.transfer.nixl import NixlEndpoint


@dataclass
class KvAux:
    """SGLang's aux record: what travels with the KV besides the cache itself."""

    first_token: int
    prompt_tokens: int
    cached_tokens: int
    nbytes: int  # the request's KV size in the model: what the modelled transfer time charges
    moved_bytes: int  # what really moves and is verified: nbytes, or a sample of it (--kv-payload sample)
    checksum: str  # blake2b-128 of the moved bytes as sent (kv_transfer.payload_checksum)


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
        self.transfers = 0  # completed transfers, their modelled and really moved bytes (/server_info sim block)
        self.modelled_bytes = 0
        self.moved_bytes = 0
        self.nixl: NixlEndpoint | None = None
        if transfer_mode == "nixl":  # resolve_transfer_mode checked that NIXL loads
            self.nixl = NixlEndpoint(endpoint_name, [PATTERN_TWICE])

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
                self.nixl.add_peer(base64.b64decode(body["agent_metadata"]), body["agent_name"])
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
        resp = web.StreamResponse(headers={"X-Kv-Bytes": str(aux.moved_bytes)})
        resp.content_length = aux.moved_bytes
        await resp.prepare(request)
        for offset in range(0, aux.moved_bytes, PATTERN_BYTES):
            length = min(PATTERN_BYTES, aux.moved_bytes - offset)
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
        decode = room.decode or {}
        try:
            peer = self.nixl.add_peer(base64.b64decode(decode["agent_metadata"]), decode["agent_name"])
            state = await self.nixl.write(peer, src, int(body["dst_addr"]), length, f"{room.room}:{offset}".encode())
        except Exception as exc:  # NIXL raises its own error types; the decode only needs the reason
            return web.json_response({"error": f"Prefill transfer failed: {exc}"}, status=500)
        if state != "DONE":
            return web.json_response({"error": f"Prefill transfer failed: NIXL WRITE to {peer} ended in state "
                                               f"{state}"}, status=500)
        return web.json_response({"ok": True})

    async def _finish(self, request: web.Request) -> web.Response:
        room = self._room_of(request)
        aux: KvAux = await asyncio.shield(room.kv_ready)
        node = (room.decode or {}).get("node")
        # the transfer takes the modelled time of the request's whole KV, from its start: the real copy of the
        # payload (all of it, or a sample) happened inside that time
        started = room.data_started_at or room.created_at
        await asyncio.sleep(max(0.0, started + self.modelled_transfer_s(aux.prompt_tokens, node) - time.monotonic()))
        latency_s = time.monotonic() - started
        if not room.done.done():
            room.done.set_result(latency_s)
            self.transfers += 1
            self.modelled_bytes += aux.nbytes
            self.moved_bytes += aux.moved_bytes
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
