"""Prefill -> decode KV transfer of the simulated engine: real bytes, verified, through NIXL or HTTP.

decode KvReceiver -> prefill bootstrap server (GET /route, then per room: handshake, ready, data, finish)

The prefill's bootstrap server (`--disaggregation-bootstrap-port`) answers SGLang's readiness routes
(`GET /route`, `GET /health`) plus our own `/sim/kv/{room}/...` control routes. The decode drives one
room through them: handshake (its metadata, like SGLang's decode sending KV indices), `ready` (long poll
until the prefill's forward produced the first token), data, `finish` (the prefill waits the modelled
transfer time, then answers its own client). Data is the model's KV size in bytes of a seeded pattern
that depends on the room; it moves through a bounded receive buffer on the decode (slots of
`slot_bytes`), by NIXL WRITE into registered CPU memory when `nixl` is importable (one
`orchestrator.transfer.nixl.NixlEndpoint` per server, no progress thread), else as an HTTP stream, and
every chunk is compared against the pattern.

Failure handling mirrors SGLang 0.5.17: the decode retries `GET /route` (15 x 1 s) before its handshake
fails; a heartbeat on the prefill's bootstrap `/health` (every 5 s, 2 failures) fails every room of a
dead prefill; KV that never comes fails at the waiting timeout (300 s); the decode then aborts the room
on the prefill, whose own request ends in a 500. All of these are flags of the server.
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np

from orchestrator.transfer.nixl import load_nixl_api

log = logging.getLogger(__name__)

MIB = 2**20
PATTERN_BYTES = 8 * MIB  # one pattern period; also the largest chunk moved in one piece
_PATTERN = np.random.default_rng(2025).integers(0, 256, PATTERN_BYTES, dtype=np.uint8)
PATTERN_TWICE = np.concatenate([_PATTERN, _PATTERN])  # any window <= PATTERN_BYTES is one slice


def expected_kv_bytes(room: int, offset: int, length: int) -> np.ndarray:
    """The bytes a room's KV holds at [offset, offset+length): a window of the pattern, shifted per room."""
    if length > PATTERN_BYTES:
        raise ValueError(f"chunk of {length} bytes exceeds the pattern period {PATTERN_BYTES}")
    start = (room * 7919 + offset) % PATTERN_BYTES
    return PATTERN_TWICE[start : start + length]


class KvTransferError(RuntimeError):
    """A room failed. kind: 'bootstrap' (handshake never completed) or 'transfer' (KV never arrived)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


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


PAYLOAD_MODES = ("sample", "full")  # the KV bytes that really move: a verified sample of each request's, or all


def payload_checksum(room: int, nbytes: int) -> str:
    """blake2b-128 of the first `nbytes` of a room's KV as the prefill sends them."""
    digest = hashlib.blake2b(digest_size=16)
    for offset in range(0, nbytes, PATTERN_BYTES):
        digest.update(expected_kv_bytes(room, offset, min(PATTERN_BYTES, nbytes - offset)).data)
    return digest.hexdigest()


class PayloadCheck:
    """The decode's end-to-end check of one room's payload: every chunk in order, then the sender's checksum."""

    def __init__(self, room: int, mode: str):
        self.room = room
        self.mode = mode
        self.reset()

    def reset(self) -> None:
        """Start over (a retried stream sends the payload again from its first byte)."""
        self.received = 0
        self._digest = hashlib.blake2b(digest_size=16)

    def chunk(self, data: np.ndarray, offset: int) -> None:
        if offset != self.received:
            raise KvTransferError("transfer", f"KV bytes of room {self.room}: chunk at byte {offset}, expected "
                                              f"{self.received} (lost or reordered chunk)")
        _verify(data, self.room, offset, self.mode)
        self._digest.update(data.data)
        self.received += len(data)

    def finish(self, nbytes: int, checksum: str) -> None:
        got = self._digest.hexdigest()
        if self.received != nbytes or got != checksum:
            raise KvTransferError(
                "transfer",
                f"KV payload of room {self.room} failed its checksum: the prefill sent {nbytes} bytes "
                f"(blake2b {checksum}), the decode received {self.received} (blake2b {got})",
            )


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
