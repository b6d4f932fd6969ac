"""KV transfer pieces of the simulated engine: the byte pattern, its verification, NIXL in one process."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from pathlib import Path

import numpy as np
import pytest

from orchestrator.engines.base import PdTimeouts
from orchestrator.engines.sim.kv.decode import KvReceiver, ReceivePool
from orchestrator.engines.sim.kv.transfer import (
    PATTERN_TWICE,
    PATTERN_BYTES,
    KvTransferError,
    _verify,
    expected_kv_bytes,
    resolve_transfer_mode,
)
from orchestrator.transfer.nixl import NixlEndpoint, load_nixl_api

os.environ.setdefault("UCX_NET_DEVICES", "lo")


def test_pattern_depends_on_room_and_offset_and_wraps():
    a = expected_kv_bytes(1, 0, 1024)
    assert not np.array_equal(a, expected_kv_bytes(2, 0, 1024))
    assert np.array_equal(expected_kv_bytes(1, 512, 512), a[512:])
    tail = expected_kv_bytes(1, PATTERN_BYTES - 100, 200)  # crosses the pattern period in one slice
    assert len(tail) == 200
    with pytest.raises(ValueError, match="exceeds the pattern period"):
        expected_kv_bytes(1, 0, PATTERN_BYTES + 1)


def test_verification_catches_a_single_flipped_byte():
    data = expected_kv_bytes(42, 4096, 8192).copy()
    _verify(data, 42, 4096)
    data[1234] ^= 0xFF
    with pytest.raises(KvTransferError, match="corrupted at byte 5330"):
        _verify(data, 42, 4096)


def test_sampled_verification_catches_a_wrong_room_but_is_sparse():
    data = expected_kv_bytes(42, 0, 64 * 4096).copy()
    _verify(data, 42, 0, "sampled")
    data[100] ^= 0xFF  # outside the sampled 64 bytes of its 4 KiB page: not seen
    _verify(data, 42, 0, "sampled")
    with pytest.raises(KvTransferError):
        _verify(expected_kv_bytes(43, 0, 64 * 4096).copy(), 42, 0, "sampled")
    with pytest.raises(KvTransferError):
        _verify(data, 42, 0, "full")


async def test_receive_pool_is_bounded_and_reuses_slots():
    pool = ReceivePool(buffer_bytes=3 * PATTERN_BYTES)
    slots = [await pool.acquire() for _ in range(3)]
    assert sorted(slots) == [0, 1, 2] and pool.buffer.nbytes == 3 * PATTERN_BYTES
    waiting = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0)
    assert not waiting.done()  # a fourth transfer waits for a slot
    pool.release(slots[1])
    assert await asyncio.wait_for(waiting, 5) == slots[1]


def test_explicit_mode_choices():
    assert resolve_transfer_mode("http") == "http"
    assert resolve_transfer_mode("auto") in ("nixl", "http")
    with pytest.raises(ValueError, match="allowed: auto, nixl, http"):
        resolve_transfer_mode("rdma")


@pytest.mark.skipif(load_nixl_api() is None, reason="nixl is not importable")
async def test_nixl_write_lands_verified_bytes_in_the_receive_buffer():
    pool = ReceivePool(buffer_bytes=2 * PATTERN_BYTES)
    sender = NixlEndpoint("test-sender", [PATTERN_TWICE])
    receiver = NixlEndpoint("test-receiver", [pool.buffer])
    peer = sender.add_peer(receiver.metadata(), receiver.name)
    assert peer == "test-receiver"  # a str, although NIXL hands back bytes
    assert sender.add_peer(b"not metadata", receiver.name) == peer  # a known peer is not added again
    room, offset, length = 31337, PATTERN_BYTES, 3 * 2**20
    src = (room * 7919 + offset) % PATTERN_BYTES
    slot = await pool.acquire()
    # No NIXL progress thread: the receiver progresses only while it polls, as the decode server does while
    # the prefill writes, so the write and the receiver's polling run together.
    write = asyncio.create_task(sender.write(peer, src, receiver.base + slot * pool.slot_bytes, length, b"31337:done"))
    notes: list[bytes] = []
    for _ in range(20000):  # poll the notification, bounded
        notes += receiver.new_notifs()
        if notes and write.done():
            break
        await asyncio.sleep(0.001)
    assert await asyncio.wait_for(write, timeout=10) == "DONE"
    assert notes == [b"31337:done"]
    _verify(pool.view(slot)[:length], room, offset)


def _threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _cpu_s(tids: set[str]) -> float:
    """User + system CPU seconds of these threads of this process, from /proc (gone threads count 0)."""
    total = 0
    for tid in tids:
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def _idle_cpu_of_new_threads(make) -> float:
    """CPU seconds that the threads `make()` starts burn over one idle second."""
    before = _threads()
    kept = make()
    new = _threads() - before
    start = _cpu_s(new)
    time.sleep(1.0)  # a measurement window, not a wait for anything
    used = _cpu_s(new) - start
    del kept
    gc.collect()  # the agent's destructor stops its threads: none may keep spinning for later tests
    assert not new & _threads(), "the agent's threads outlived it"
    return used


@pytest.mark.skipif(load_nixl_api() is None, reason="nixl is not importable")
def test_the_sims_nixl_agent_burns_no_cpu_while_idle():
    """NIXL's progress thread busy-polls a whole core per agent; the sim's agents run without it (two of them
    starved a 2-core machine: a 1000-prompt run took 759 s instead of the modelled 61 s)."""
    sim = _idle_cpu_of_new_threads(lambda: KvReceiver(PdTimeouts(), "nixl", "node-a", PATTERN_BYTES))
    with_thread = _idle_cpu_of_new_threads(
        lambda: NixlEndpoint("probe-with-thread", [np.zeros(4096, np.uint8)], progress_thread=True))
    assert sim < 0.05, f"the sim's idle NIXL agent used {sim:.2f} CPU s in 1 s"
    assert with_thread > 0.1, f"control: an agent with a progress thread used only {with_thread:.2f} CPU s in 1 s"
