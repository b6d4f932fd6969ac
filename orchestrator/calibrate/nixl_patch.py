"""A small patch to SGLang 0.5.17's NIXL KV sender (`sglang/srt/disaggregation/nixl/conn.py`).

Why: for equal-TP/MLA peers SGLang 0.5.17 sends KV through NIXL "prepped" descriptor lists with one
descriptor per KV slot per layer. At `--page-size 1` that is one 1,152-byte descriptor per token per layer
(DeepSeek MLA), so a 10 MB request is ~9,000 descriptors, and UCX pays per descriptor: 0.036 GB/s and
466 ms per request on 2xH200 (docs/performance.md). SGLang's own non-prepped path in the same function
already merges runs of consecutive slots on both sides into one descriptor (`group_concurrent_contiguous`);
consecutive slots are the common case, since the KV allocators hand out sorted free slots.

What the patch does (text edits, each anchored on a line that must occur exactly once):
  1. `_send_kvcache_generic` skips the prepped path when coalescing is on, so KV goes through the merged
     (non-prepped) descriptors. On when the environment has PDO_NIXL_COALESCE=1, or when the file named by
     PDO_NIXL_COALESCE_FILE exists (read per transfer, so one server pair can A/B both paths).
  2. The transfer worker logs one line per KV chunk:
     `PDO_NIXL room=.. chunk=.. last=.. slots=.. descs=.. bytes=.. mode=prepped|coalesced post_ms=.. wait_ms=..`
     (post = building and posting the transfer, wait = until NIXL reports DONE).
The bytes moved and where they land are unchanged; outputs must be too (checked on the GPU by comparing
top-k logprobs with the patch on and off). `python -m orchestrator.calibrate nixl-patch SITE_DIR` applies it.
"""

from __future__ import annotations

from pathlib import Path

TARGET = "sglang/srt/disaggregation/nixl/conn.py"
MARK = "# pd-orchestrator nixl patch v1"

EDITS = [
    (  # time at which the worker took the chunk
        "            kv_chunk: TransferKVChunk = queue.get()\n",
        "            kv_chunk: TransferKVChunk = queue.get()\n"
        "            _pdo_t_pop = time.perf_counter()\n"
        "            _PDO_TLS.descs = 0\n",
    ),
    (  # the prepped path is skipped when coalescing is on
        "            not bypass_prepped\n"
        "            and src_data_ptrs is self.kv_args.kv_data_ptrs\n",
        "            not bypass_prepped\n"
        "            and not _pdo_coalesce_kv()\n"
        "            and src_data_ptrs is self.kv_args.kv_data_ptrs\n",
    ),
    (  # descriptor count on the prepped path
        "                dst_data_indices, num_layers, num_slots_dst\n"
        "            )\n"
        "            xfer_handle = self.agent.make_prepped_xfer(\n",
        "                dst_data_indices, num_layers, num_slots_dst\n"
        "            )\n"
        "            _PDO_TLS.descs = getattr(_PDO_TLS, 'descs', 0) + len(src_indices)\n"
        "            xfer_handle = self.agent.make_prepped_xfer(\n",
    ),
    (  # descriptor count on the merged path
        "        src_descs = self.agent.get_xfer_descs(src_reqs, src_mem_kind)\n",
        "        _PDO_TLS.descs = getattr(_PDO_TLS, 'descs', 0) + len(src_reqs)\n"
        "        src_descs = self.agent.get_xfer_descs(src_reqs, src_mem_kind)\n",
    ),
    (  # posting done: waiting starts
        "                if staging_deferred:\n"
        "                    # Chunk has been re-enqueued; do not advance status.\n"
        "                    continue\n"
        "\n"
        "                while handles:\n",
        "                if staging_deferred:\n"
        "                    # Chunk has been re-enqueued; do not advance status.\n"
        "                    continue\n"
        "\n"
        "                _pdo_t_wait = time.perf_counter()\n"
        "                while handles:\n",
    ),
    (  # all handles DONE: one log line per chunk
        "                    time.sleep(0)\n"
        "\n"
        "                if kv_chunk.is_last_chunk:\n",
        "                    time.sleep(0)\n"
        "\n"
        "                _pdo_log_chunk(self, room, kv_chunk, _pdo_t_pop, _pdo_t_wait)\n"
        "                if kv_chunk.is_last_chunk:\n",
    ),
]

TAIL = f'''

{MARK}
_PDO_TLS = threading.local()  # per transfer-worker thread: descriptors posted for the current chunk


def _pdo_coalesce_kv():
    import os

    if os.environ.get("PDO_NIXL_COALESCE") == "1":
        return True
    flag = os.environ.get("PDO_NIXL_COALESCE_FILE")
    return bool(flag) and os.path.exists(flag)


def _pdo_log_chunk(mgr, room, kv_chunk, t_pop, t_wait):
    t_done = time.perf_counter()
    slots = len(kv_chunk.prefill_kv_indices)
    item = mgr.kv_args.kv_item_lens[0] if mgr.kv_args.kv_item_lens else 0
    nbytes = slots * sum(mgr.kv_args.kv_item_lens)
    logger.info(
        "PDO_NIXL room=%s chunk=%s last=%d slots=%d item_bytes=%d descs=%d bytes=%d mode=%s "
        "post_ms=%.3f wait_ms=%.3f",
        room, kv_chunk.chunk_id, int(kv_chunk.is_last_chunk), slots, item, getattr(_PDO_TLS, "descs", 0),
        nbytes, "coalesced" if _pdo_coalesce_kv() else "prepped",
        (t_wait - t_pop) * 1000.0, (t_done - t_wait) * 1000.0,
    )
'''


class PatchError(RuntimeError):
    pass


def patch_text(src: str) -> str:
    """Return the patched source; raises PatchError naming the first anchor that is not there exactly once."""
    if MARK in src:
        return src
    for i, (old, new) in enumerate(EDITS):
        n = src.count(old)
        if n != 1:
            raise PatchError(f"nixl patch edit {i}: anchor found {n} times (want 1): {old.strip()[:70]!r}; "
                             "SGLang's nixl/conn.py changed: re-check the patch against it")
        src = src.replace(old, new)
    return src + TAIL


def apply(site_dir: str | Path) -> Path:
    path = Path(site_dir) / TARGET
    if not path.is_file():
        raise PatchError(f"{path} not found: pass the folder that holds the installed sglang package")
    src = path.read_text()
    out = patch_text(src)
    if out != src:
        path.write_text(out)
        for cached in path.parent.glob("__pycache__/conn.*.pyc"):
            cached.unlink()
    compile(out, str(path), "exec")
    return path
