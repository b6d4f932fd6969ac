"""The simulated KV transfer's payload: a verified, checksummed sample by default, all the bytes on request."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from orchestrator.engines.sim.kv.transfer import (
    MIB,
    KvTransferError,
    PayloadCheck,
    expected_kv_bytes,
    payload_checksum,
)
from orchestrator.config.model_presets import DEEPSEEK_R1
from tests.support import HAVE_NIXL, pd_generate, sim_engine_config, start_servers

ROOM = 4242


def payload(nbytes: int) -> np.ndarray:
    return np.concatenate([expected_kv_bytes(ROOM, o, min(8 * MIB, nbytes - o)) for o in range(0, nbytes, 8 * MIB)])


def receive(data: np.ndarray, mode: str, chunk: int = 256 * 1024, skip: int | None = None) -> PayloadCheck:
    check = PayloadCheck(ROOM, mode)
    for offset in range(0, len(data), chunk):
        if offset == skip:
            continue
        check.chunk(data[offset : offset + chunk], offset)
    return check


def test_an_intact_payload_passes_pattern_and_checksum():
    data = payload(MIB + 4097)
    receive(data, "full").finish(len(data), payload_checksum(ROOM, len(data)))
    receive(data, "sampled").finish(len(data), payload_checksum(ROOM, len(data)))


def test_a_corrupted_byte_fails_the_transfer_with_its_reason():
    data = payload(MIB).copy()
    data[300_001] ^= 0x40
    with pytest.raises(KvTransferError, match=f"KV bytes of room {ROOM} corrupted at byte 300001"):
        receive(data, "full")
    # sampled pattern checks skip that byte; the end-to-end checksum still fails the room
    check = receive(data, "sampled")
    with pytest.raises(KvTransferError, match=f"KV payload of room {ROOM} failed its checksum") as err:
        check.finish(len(data), payload_checksum(ROOM, len(data)))
    assert err.value.kind == "transfer"


def test_a_lost_chunk_or_a_short_payload_fails():
    data = payload(MIB)
    with pytest.raises(KvTransferError, match="lost or reordered chunk"):
        receive(data, "full", skip=256 * 1024)
    check = receive(data[: MIB // 2], "full")
    with pytest.raises(KvTransferError, match=f"prefill sent {MIB} bytes .* the decode received {MIB // 2}"):
        check.finish(MIB, payload_checksum(ROOM, MIB))


@pytest.mark.slow
@pytest.mark.parametrize("payload_mode", ["sample", "full"])
@pytest.mark.parametrize("transfer", ["nixl", "http"])
async def test_pd_pair_moves_a_sample_by_default_and_every_byte_with_full(tmp_path, payload_mode, transfer):
    if transfer == "nixl" and not HAVE_NIXL:
        pytest.skip("nixl is not importable")
    cfg = sim_engine_config(kv_transfer=transfer, kv_payload=payload_mode)
    prefill, decode = start_servers(cfg, ["prefill", "decode"], tmp_path)
    try:
        prompts = [list(range(3, 8)), [(7 * i) % 129000 for i in range(1200)]]  # 351 KB and 84 MB of R1 KV
        results = await asyncio.gather(*(
            pd_generate(prefill, decode, {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}})
            for ids in prompts))
        assert all(p.status_code == 200 and d.status_code == 200 for p, d in results)
        modelled = [len(ids) * DEEPSEEK_R1.kv_bytes_per_token(2) for ids in prompts]
        moved = modelled if payload_mode == "full" else [min(m, MIB) for m in modelled]
        sent = httpx.get(f"{prefill.url}/server_info").json()["sim"]["kv_payload"]
        got = httpx.get(f"{decode.url}/server_info").json()["sim"]["kv_payload"]
        assert sent["mode"] == got["mode"] == payload_mode
        assert sent["transfers"] == 2 and sent["modelled_bytes"] == sum(modelled)
        assert sent["moved_bytes"] == sum(moved)
        assert got["verified_transfers"] == 2 and got["received_bytes"] == sum(moved)
    finally:
        for s in (prefill, decode):
            s.stop()
