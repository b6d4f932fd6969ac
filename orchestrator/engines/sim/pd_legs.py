"""A PD request's leg on the simulated engine, as SGLang orders it: the prefill waits for the decode's handshake, runs
its one token, hands its KV over and ends with the transfer; the decode connects to the prefill's bootstrap server,
pre-allocates the prompt's KV, fetches it and decodes. engine.py picks the leg; the KV moves through kv/."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from orchestrator.engines.sim.faults import RequestFate
from orchestrator.engines.sim.inflight import Run
from orchestrator.engines.sim.kv.decode import KvReceiver
from orchestrator.engines.sim.kv.prefill import KvAux, PrefillKvServer
from orchestrator.engines.sim.kv.transfer import KvTransferError, payload_checksum
from orchestrator.engines.sim.metrics import PdQueueSizes, SimMetrics
from orchestrator.engines.sim.scheduler import Scheduler
from orchestrator.engines.sim.settings import SimSettings


class LegServer(Protocol):
    """What a leg uses of its server (SimEngine)."""

    settings: SimSettings
    scheduler: Scheduler
    metrics: SimMetrics
    queues: PdQueueSizes
    prefill_kv: PrefillKvServer | None
    receiver: KvReceiver | None

    def kv_bytes(self, prompt_tokens: int) -> int: ...

    def kv_payload_bytes(self, prompt_tokens: int) -> int: ...

    async def run_in_scheduler(self, run: Run) -> None: ...


async def drive_prefill(server: LegServer, run: Run, fate: RequestFate) -> None:
    """The prefill leg: wait for the decode's handshake, run the prompt, hand the KV over, end with the transfer."""
    assert server.prefill_kv is not None
    room_id = run.item.bootstrap_room
    assert room_id is not None, "check_item refuses a PD request without a bootstrap room"
    room = server.prefill_kv.room(room_id)
    try:
        server.queues.prefill_bootstrap += 1
        try:
            await asyncio.wait_for(room.handshaken.wait(), server.settings.timeouts.bootstrap_timeout_s)
        except asyncio.TimeoutError:
            server.metrics.bootstrap_failed()
            raise KvTransferError(
                "bootstrap",
                f"Prefill bootstrap failed for request rank=0 (bootstrap_room={room_id}): no decode handshake "
                f"within {server.settings.timeouts.bootstrap_timeout_s:g} s",
            ) from None
        finally:
            server.queues.prefill_bootstrap -= 1
        await server.run_in_scheduler(run)
        if run.req.aborted:
            return
        server.queues.prefill_inflight += 1
        try:
            if not fate.hang_transfer:
                moved = server.kv_payload_bytes(run.req.prompt_len)
                aux = KvAux(run.req.output_ids[0], run.req.prompt_len, 0, server.kv_bytes(run.req.prompt_len),
                            moved, payload_checksum(room_id, moved))
                room.kv_ready.set_result(aux)
            try:
                await asyncio.shield(room.done)
            except KvTransferError:
                server.metrics.transfer_failed()
                raise
            run.final_reason = {"type": "length", "length": 0}
            run.req.finished_at = time.monotonic()  # the prefill's request ends with its transfer
        finally:
            server.queues.prefill_inflight -= 1
    finally:
        room.fail("prefill request ended before the transfer")  # no-op once the transfer completed
        server.prefill_kv.drop(room_id)
        await server.scheduler.release(run.req)


async def drive_decode(server: LegServer, run: Run) -> None:
    """The decode leg: connect to the prefill's bootstrap server, pre-allocate, fetch the KV, decode."""
    assert server.receiver is not None
    item = run.item
    addr = f"http://{_url_host(item.bootstrap_host)}:{item.bootstrap_port or server.settings.bootstrap_port}"
    room = item.bootstrap_room
    assert room is not None, "check_item refuses a PD request without a bootstrap room"
    server.queues.decode_prealloc += 1
    in_prealloc = True
    try:
        try:
            await server.receiver.connect(addr, room)
        except KvTransferError:
            server.metrics.bootstrap_failed()
            raise
        await server.scheduler.preallocate(run.req)  # the prefill starts only after this (SGLang's order)
        if run.req.finished:  # refused or failed while waiting for KV room; the router aborts the prefill leg
            return
        server.queues.decode_prealloc -= 1
        in_prealloc = False
        server.queues.decode_transfer += 1
        try:
            aux = await server.receiver.fetch(addr, room, item.rid)
        except KvTransferError:
            server.metrics.transfer_failed()
            raise
        finally:
            server.queues.decode_transfer -= 1
        run.cached_tokens = aux.cached_tokens
        run.req.first_token = aux.first_token
        await server.run_in_scheduler(run)
    finally:
        if in_prealloc:
            server.queues.decode_prealloc -= 1
        if not run.submitted:
            server.scheduler.drop(run.req)  # frees its pre-allocated KV


def _url_host(host: str | None) -> str:
    return f"[{host}]" if host and ":" in host and not host.startswith("[") else str(host)
