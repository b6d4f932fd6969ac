"""Early KV page indices: a small patch to SGLang 0.5.17's PD prefill (`disaggregation/prefill.py`, plus one line in
`mem_cache/radix_cache.py`), switched on per transfer by PDO_EARLY_KV_INDICES=1 (or PDO_NIXL_EARLY_KV_INDICES=1, or
the file named by PDO_NIXL_EARLY_KV_INDICES_FILE existing); off, SGLang runs its own code.

Why (benchmarks/results/2026-11-24-kv-transfer-h100-s5): in the overlap loop a batch N's result is processed after
batch N+1 was launched, and `_apply_war_barrier()` right after that launch makes the scheduler's stream wait for
N+1's whole forward. Processing N's result sends each request's KV: `send_kv_chunk` reads the request's row of
`req_to_token` on the GPU and `kv_to_page_indices(...)` copies it to the host with `.cpu()`, on the scheduler's
stream, so the host waits for batch N+1's forward (~465 ms of the ~528 ms KV computed -> decode sees, one H100).

The patch:
  1. `event_loop_overlap_disagg_prefill`: between `run_batch(N+1)` and `_apply_war_barrier()` (so before the
     scheduler's stream is made to wait for N+1), `_pdo_snapshot_kv_rows` copies, for every request of batch N
     (still at the head of `result_queue`), its `req_to_token` row up to the end of its scheduled range into pinned
     host memory (non_blocking) and records an event. The copy is ordered after every write made so far on the
     scheduler's stream (the allocations of N and N+1, the chunked request's cache insert of this iteration) and
     after N's forward (the barrier of N's launch), but not after N+1's forward.
  2. `send_kv_chunk`: `_pdo_early_page_indices` returns `(row[start:end][::page_size] // page_size).numpy()` from that
     host copy (after waiting for its event): the same int32 values, pages and order as
     `kv_to_page_indices(req_to_token[idx, start:end], page_size)` on the device. It returns None (SGLang's own path
     runs) when the switch is off, there is no copy of this request from the current iteration (`last_batch` moved
     on), the copy is shorter than `end`, the request's pool row changed, the tree cache is neither RadixCache nor
     ChunkCache, or the row was rewritten after the copy (3.).
  3. `RadixCache.cache_unfinished_req`: when the insert found more of the request's tokens in the tree than the
     request had protected (`new_prefix_len != req.cache_protected_len`), it rewrites part of the row to the tree's
     slots (and frees the request's duplicates); the patch counts that on the request (`_pdo_kv_rewrites`), so a
     copy taken before it is not used. Without prefix hits (the calibration loads) the row is never rewritten.
Chunking, the state payloads (`state_indices`, e.g. DSA/SWA) and the sender are untouched; only where the host copy
of the page indices is made moves. With the switch on, the prefill logs `PDO_EARLY used=U fallback=F` (counts so
far) at the 1st, 65th, 129th, ... send.
`python -m orchestrator.calibrate nixl-patch SITE_DIR` applies it together with `nixl_patch` (all or nothing).
"""

from __future__ import annotations

PREFILL_TARGET = "sglang/srt/disaggregation/prefill.py"
RADIX_TARGET = "sglang/srt/mem_cache/radix_cache.py"
PREFILL_MARK = "# pd-orchestrator early KV indices patch v1"
RADIX_MARK = "# pd-orchestrator early KV indices radix mark v1"

PREFILL_EDITS = [
    (  # overlap loop: host copy of batch N's rows before the scheduler's stream waits for batch N+1's forward
        "                self._apply_war_barrier()\n"
        "                self.result_queue.append((batch.copy(), batch_result))\n",
        "                _pdo_snapshot_kv_rows(self)\n"
        "                self._apply_war_barrier()\n"
        "                self.result_queue.append((batch.copy(), batch_result))\n",
    ),
    (  # send_kv_chunk: page indices from that host copy when it is valid, else SGLang's device read + .cpu()
        "        kv_indices = self.req_to_token_pool.req_to_token[\n"
        "            req.req_pool_idx, start_idx:end_idx\n"
        "        ]\n"
        "        page_indices = kv_to_page_indices(kv_indices, page_size)\n",
        "        page_indices = _pdo_early_page_indices(self, req, start_idx, end_idx, page_size)\n"
        "        if page_indices is None:\n"
        "            kv_indices = self.req_to_token_pool.req_to_token[\n"
        "                req.req_pool_idx, start_idx:end_idx\n"
        "            ]\n"
        "            page_indices = kv_to_page_indices(kv_indices, page_size)\n",
    ),
]

PREFILL_TAIL = f'''

{PREFILL_MARK}
_PDO_EARLY_COUNTS = [0, 0]  # sends that used the host copy, sends that fell back (while the switch was on)


def _pdo_early_on():
    import os

    if os.environ.get("PDO_EARLY_KV_INDICES") == "1" or os.environ.get("PDO_NIXL_EARLY_KV_INDICES") == "1":
        return True
    flag = os.environ.get("PDO_NIXL_EARLY_KV_INDICES_FILE")
    return bool(flag) and os.path.exists(flag)


def _pdo_early_cache_ok(scheduler):
    return type(scheduler.tree_cache).__name__ in ("RadixCache", "ChunkCache")


def _pdo_snapshot_kv_rows(scheduler):
    """Overlap loop, after launching batch N+1 and before the WAR barrier: host copies of batch N's rows."""
    snaps = {{}}
    scheduler._pdo_kv_snaps = snaps  # replaced every launch: a copy serves only the result processed next
    scheduler._pdo_kv_snaps_owner = scheduler.last_batch  # batch N until the end of this iteration
    scheduler._pdo_kv_snaps_event = None
    if not (_pdo_early_on() and scheduler.result_queue and _pdo_early_cache_ok(scheduler)):
        return
    table = scheduler.req_to_token_pool.req_to_token
    for req in scheduler.result_queue[0][0].reqs:
        if req.req_pool_idx is None or req.extend_range is None:
            continue
        end = min(req.extend_range.end, len(req.origin_input_ids))
        row = table[req.req_pool_idx, :end]
        host = row.to("cpu", non_blocking=True) if row.is_cuda else row.clone()
        snaps[id(req)] = (req, int(req.req_pool_idx), getattr(req, "_pdo_kv_rewrites", 0), host)
    if snaps and table.is_cuda:
        import torch

        event = torch.cuda.Event()
        event.record()
        scheduler._pdo_kv_snaps_event = event


def _pdo_early_page_indices(scheduler, req, start_idx, end_idx, page_size):
    """The page indices of req's KV [start_idx, end_idx) from the host copy, or None for SGLang's own path."""
    if not _pdo_early_on():
        return None
    snap = getattr(scheduler, "_pdo_kv_snaps", {{}}).get(id(req))
    if (snap is None or scheduler._pdo_kv_snaps_owner is not scheduler.last_batch
            or snap[0] is not req or snap[1] != req.req_pool_idx
            or snap[2] != getattr(req, "_pdo_kv_rewrites", 0) or snap[3].shape[0] < end_idx
            or not _pdo_early_cache_ok(scheduler)):
        _pdo_early_count(1)
        return None
    event = getattr(scheduler, "_pdo_kv_snaps_event", None)
    if event is not None:
        event.synchronize()
    _pdo_early_count(0)
    return (snap[3][start_idx:end_idx][::page_size] // page_size).numpy()


def _pdo_early_count(i):
    _PDO_EARLY_COUNTS[i] += 1
    if sum(_PDO_EARLY_COUNTS) % 64 == 1:
        logger.info("PDO_EARLY used=%d fallback=%d", *_PDO_EARLY_COUNTS)
'''

RADIX_EDITS = [
    (  # the insert found tokens of this request already in the tree: the row is rewritten to the tree's slots
        "        new_prefix_len = result.prefix_len\n"
        "\n"
        "        self.token_to_kv_pool_allocator.free_segment(\n",
        "        new_prefix_len = result.prefix_len\n"
        "        if new_prefix_len != req.cache_protected_len:  " + RADIX_MARK + "\n"
        "            req._pdo_kv_rewrites = getattr(req, \"_pdo_kv_rewrites\", 0) + 1\n"
        "\n"
        "        self.token_to_kv_pool_allocator.free_segment(\n",
    ),
]

PLANS = [(PREFILL_TARGET, PREFILL_EDITS, PREFILL_TAIL, PREFILL_MARK), (RADIX_TARGET, RADIX_EDITS, "", RADIX_MARK)]
