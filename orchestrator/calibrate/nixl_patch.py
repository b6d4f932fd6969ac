"""A small patch to SGLang 0.5.17's NIXL KV path (`sglang/srt/disaggregation/nixl/conn.py`).

Why: on one H100 SGLang reported ~540-600 ms per request (`kv_transfer_latency_ms`) while NIXL's own time was
~10-16 ms (benchmarks/results/2026-11-24-calibration-h100-pd). To see where the time goes, and to try two
changes to the sender, the patch:
  1. Coalescing (flag COALESCE): `_send_kvcache_generic` skips the prepped path, so KV goes through SGLang's
     own merged descriptors (`group_concurrent_contiguous`: one descriptor per run of consecutive slots per
     layer) instead of one descriptor per slot per layer (27,000 per ~35 MB request at page size 1).
  2. Sharding by room (flag SHARD_BY_ROOM): `add_transfer_request` puts a request's chunks on transfer queue
     `room % SGLANG_DISAGGREGATION_QUEUE_SIZE` instead of `sum(decode ports) % size`: with one decode server
     every request otherwise lands on the same queue, so one of the 4 worker threads moves all the KV one
     request after another. A room's chunks still share one queue (one worker), so their order is kept.
  3. Timestamps (always): one `PDO_NIXL` line per KV chunk from the transfer worker (descriptors, bytes,
     post and wait ms, queue, queue depth, wall times of enqueue / pop / done) and one `PDO_KV` line when
     the prefill scheduler's poll first sees a request's transfer done (`prefill_polled`) and when the
     decode scheduler's poll does (`decode_seen`). Wall clock (`time.time()`): both servers share one host.
  4. Prefill polling (flag PREFILL_POLL, `sglang/srt/disaggregation/prefill.py`): SGLang's overlap loop polls
     its in-flight transfers once per iteration, and an iteration lasts a whole forward batch (the scheduler
     blocks while it prepares the next batch until the GPU has finished the running one). With the flag, each
     iteration first waits for the running batch's `copy_done` event while polling the in-flight transfers
     every 0.5 ms (until none is left), so a finished transfer is concluded (KV released, answer sent,
     `kv_transfer_latency_ms` observed) when it finishes, not one batch later. The price: the next batch's
     CPU preparation no longer overlaps the running batch while transfers are in flight. Only with
     TP = PP = CP = 1 and no DP attention (elsewhere the poll is an all-reduce every rank must call alike).
     (v1 polled inside `copy_done.synchronize()` of the result processing: measured on the H100, it never
     waited there, because by then the batch had already finished.) The prefill also logs one `PDO_ITER`
     line per loop iteration that ran a batch: where the iteration's time went (scheduling, `run_batch`,
     processing the previous result, the poll), whether the running batch had already finished at the top
     of the next iteration, and how long the poll-wait took. `PDO_READY` lines name the requests of a batch
     whose forward was seen done (at the top of the next overlap iteration, and in the result processing once
     the sampled ids are on the host, which in the non-overlap loop waits for the forward): from then on their
     KV is computed, so that is when a transfer could start.
A flag is on when the environment has PDO_NIXL_<FLAG>=1, or when the file named by PDO_NIXL_<FLAG>_FILE
exists (read per transfer, so one server pair can A/B them). Bytes moved and where they land are unchanged;
outputs must be too (checked on the GPU by comparing top-k logprobs across flags).
`python -m orchestrator.calibrate nixl-patch SITE_DIR` applies it (edits anchored on lines that must occur
exactly once; a changed SGLang source is refused, not half-patched).
"""

from __future__ import annotations

from pathlib import Path

TARGET = "sglang/srt/disaggregation/nixl/conn.py"
PREFILL_TARGET = "sglang/srt/disaggregation/prefill.py"
MARK = "# pd-orchestrator nixl patch v2"

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
        "            and not _pdo_flag('COALESCE')\n"
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
    (  # queue choice (by room when SHARD_BY_ROOM is on) and the enqueue time of every chunk
        "        shard_idx = session_port_sum % len(self.transfer_queues)\n",
        "        shard_idx = session_port_sum % len(self.transfer_queues)\n"
        "        if _pdo_flag('SHARD_BY_ROOM'):\n"
        "            shard_idx = bootstrap_room % len(self.transfer_queues)\n"
        "        _pdo_note_enqueue(bootstrap_room, chunk_id, shard_idx, self.transfer_queues[shard_idx])\n",
    ),
    (  # prefill: the scheduler's poll sees the transfer done (SGLang's kv_transfer_latency_ms ends here)
        "                time.perf_counter() - self._transfer_start_time\n"
        "            )\n"
        "        return status\n",
        "                time.perf_counter() - self._transfer_start_time\n"
        "            )\n"
        "            _pdo_log_event('prefill_polled', self.bootstrap_room)\n"
        "        return status\n",
    ),
    (  # decode: the scheduler's poll sees every chunk and the aux data arrived
        "            self.conclude_state = KVPoll.Success\n"
        "            del self.kv_mgr.transfer_statuses[self.bootstrap_room]\n",
        "            self.conclude_state = KVPoll.Success\n"
        "            del self.kv_mgr.transfer_statuses[self.bootstrap_room]\n"
        "            _pdo_log_event('decode_seen', self.bootstrap_room)\n",
    ),
]

TAIL = f'''

{MARK}
_PDO_TLS = threading.local()  # per transfer-worker thread: descriptors posted for the current chunk
_PDO_ENQ = {{}}  # (room, chunk_id) -> (wall time of enqueue, queue index, chunks ahead in that queue)


def _pdo_flag(name):
    import os

    if os.environ.get("PDO_NIXL_" + name) == "1":
        return True
    flag = os.environ.get("PDO_NIXL_" + name + "_FILE")
    return bool(flag) and os.path.exists(flag)


def _pdo_note_enqueue(room, chunk_id, shard_idx, queue):
    _PDO_ENQ[(room, chunk_id)] = (time.time(), shard_idx, len(getattr(queue, "_buf", ())))


def _pdo_log_event(event, room):
    logger.info("PDO_KV event=%s room=%s t=%.6f", event, room, time.time())


def _pdo_log_chunk(mgr, room, kv_chunk, t_pop, t_wait):
    t_done = time.perf_counter()
    wall_done = time.time()
    enq_t, shard, depth = _PDO_ENQ.pop((room, kv_chunk.chunk_id), (0.0, -1, -1))
    slots = len(kv_chunk.prefill_kv_indices)
    item = mgr.kv_args.kv_item_lens[0] if mgr.kv_args.kv_item_lens else 0
    nbytes = slots * sum(mgr.kv_args.kv_item_lens)
    logger.info(
        "PDO_NIXL room=%s chunk=%s last=%d slots=%d item_bytes=%d descs=%d bytes=%d mode=%s "
        "post_ms=%.3f wait_ms=%.3f queue=%d depth=%d shard=%s t_enq=%.6f t_pop=%.6f t_done=%.6f",
        room, kv_chunk.chunk_id, int(kv_chunk.is_last_chunk), slots, item, getattr(_PDO_TLS, "descs", 0),
        nbytes, "coalesced" if _pdo_flag("COALESCE") else "prepped",
        (t_wait - t_pop) * 1000.0, (t_done - t_wait) * 1000.0,
        shard, depth, "room" if _pdo_flag("SHARD_BY_ROOM") else "dst",
        enq_t, wall_done - (t_done - t_pop), wall_done,
    )
'''


PREFILL_MARK = "# pd-orchestrator prefill poll patch v5"
PREFILL_EDITS = [
    (  # overlap loop: before receiving and scheduling, wait for the in-flight batch while polling transfers
        "    def event_loop_overlap_disagg_prefill(self: Scheduler) -> None:\n"
        "        self.result_queue = deque()\n"
        "\n"
        "        while True:\n",
        "    def event_loop_overlap_disagg_prefill(self: Scheduler) -> None:\n"
        "        self.result_queue = deque()\n"
        "\n"
        "        while True:\n"
        "            _pdo_wait_polling_transfers(self)\n",
    ),
    (  # timing marks around the launch of a batch ...
        "                batch_result = self.run_batch(batch)\n"
        "                self._apply_war_barrier()\n",
        "                _pdo_mark(self, 'run0')\n"
        "                batch_result = self.run_batch(batch)\n"
        "                _pdo_mark(self, 'run1')\n"
        "                self._apply_war_barrier()\n",
    ),
    (  # ... around the processing of the previous batch's result (where its KV is sent) ...
        "                tmp_batch, tmp_result = self.result_queue.popleft()\n"
        "                self.process_batch_result(tmp_batch, tmp_result)\n",
        "                _pdo_mark(self, 'res0')\n"
        "                tmp_batch, tmp_result = self.result_queue.popleft()\n"
        "                self.process_batch_result(tmp_batch, tmp_result)\n"
        "                _pdo_mark(self, 'res1')\n",
    ),
    (  # ... and after the once-per-iteration poll of the in-flight transfers
        "            self.launch_batch_sample_if_needed(batch_result, batch)\n",
        "            _pdo_mark(self, 'poll1')\n"
        "            self.launch_batch_sample_if_needed(batch_result, batch)\n",
    ),
    (  # result processing (overlap loop): poll while waiting for the batch
        "        if copy_done is not None:\n"
        "            copy_done.synchronize()\n",
        "        if copy_done is not None:\n"
        "            _pdo_sync_polling(self, copy_done)\n",
    ),
    (  # both loops: the sampled ids are on the host, so the batch's forward is done: its KV is computed
        "        next_token_ids = result.next_token_ids.tolist()\n",
        "        next_token_ids = result.next_token_ids.tolist()\n"
        "        _pdo_log_ready(batch)\n",
    ),
]
PREFILL_TAIL = f'''

{PREFILL_MARK}
def _pdo_mark(scheduler, name):
    import time

    marks = getattr(scheduler, "_pdo_marks", None)
    if marks is not None:
        marks[name] = time.perf_counter()


def _pdo_poll_flag():
    import os

    flag = os.environ.get("PDO_NIXL_PREFILL_POLL_FILE")
    return os.environ.get("PDO_NIXL_PREFILL_POLL") == "1" or (bool(flag) and os.path.exists(flag))


def _pdo_single_rank(scheduler):
    sa = scheduler.server_args
    return (sa.tp_size == 1 and sa.pp_size == 1 and (getattr(sa, "attn_cp_size", 1) or 1) == 1
            and not sa.enable_dp_attention)


def _pdo_log_ready(batch):
    """The batch's forward is done, so its requests' KV (of this chunk) is computed: log when that was seen."""
    import time

    rooms = [str(getattr(r, "bootstrap_room", None)) for r in getattr(batch, "reqs", None) or []]
    if rooms:
        logger.info("PDO_READY t=%.6f rooms=%s", time.time(), ",".join(rooms))


def _pdo_sync_polling(scheduler, copy_done):
    import time

    if _pdo_poll_flag() and _pdo_single_rank(scheduler) and hasattr(copy_done, "query"):
        while scheduler.disagg_prefill_inflight_queue and not copy_done.query():
            scheduler.process_disagg_prefill_inflight_queue()
            time.sleep(0.0005)
    copy_done.synchronize()


def _pdo_wait_polling_transfers(scheduler):
    """Top of the overlap loop: log where the last iteration that ran a batch spent its time; with the
    PREFILL_POLL flag, wait for the running batch while polling the in-flight transfers."""
    import time

    now = time.perf_counter()
    marks = getattr(scheduler, "_pdo_marks", None) or {{}}
    if "run0" in marks:
        top = marks["top"]

        def span(a, b):
            return (marks[b] - marks[a]) * 1000.0 if a in marks and b in marks else -1.0
        logger.info(
            "PDO_ITER sched_ms=%.2f run_ms=%.2f gap_ms=%.2f result_ms=%.2f poll_ms=%.2f tail_ms=%.2f "
            "running_done_at_top=%d wait_ms=%.2f polls=%d inflight=%d",
            (marks["run0"] - top) * 1000.0, span("run0", "run1"), span("run1", "res0"), span("res0", "res1"),
            span("res1", "poll1") if "res1" in marks else span("run1", "poll1"),
            (now - marks.get("poll1", now)) * 1000.0, marks.get("done_at_top", -1), marks.get("wait_ms", 0.0),
            marks.get("polls", 0), len(scheduler.disagg_prefill_inflight_queue),
        )
    marks = {{"top": now}}
    scheduler._pdo_marks = marks
    if not scheduler.result_queue:
        return
    copy_done = getattr(scheduler.result_queue[-1][1], "copy_done", None)
    if copy_done is None or not hasattr(copy_done, "query"):
        return
    marks["done_at_top"] = int(copy_done.query())
    if marks["done_at_top"] and not getattr(scheduler, "_pdo_ready_logged", None) is scheduler.result_queue[-1][0]:
        scheduler._pdo_ready_logged = scheduler.result_queue[-1][0]
        _pdo_log_ready(scheduler.result_queue[-1][0])   # seen done here, before its result is processed
    if not (_pdo_poll_flag() and _pdo_single_rank(scheduler)):
        return
    polls = 0
    while scheduler.disagg_prefill_inflight_queue and not copy_done.query():
        scheduler.process_disagg_prefill_inflight_queue()
        polls += 1
        time.sleep(0.0005)
    marks["polls"] = polls
    marks["wait_ms"] = (time.perf_counter() - now) * 1000.0
    marks["top"] = time.perf_counter()
'''


class PatchError(RuntimeError):
    pass


def patch_text(src: str, edits=None, tail: str | None = None, mark: str = MARK) -> str:
    """Return the patched source; raises PatchError naming the first anchor that is not there exactly once."""
    edits, tail = (EDITS if edits is None else edits), (TAIL if tail is None else tail)
    if mark in src:
        return src
    for i, (old, new) in enumerate(edits):
        n = src.count(old)
        if n != 1:
            raise PatchError(f"nixl patch edit {i}: anchor found {n} times (want 1): {old.strip()[:70]!r}; "
                             "SGLang's nixl/conn.py changed: re-check the patch against it")
        src = src.replace(old, new)
    return src + tail


PLANS = [(TARGET, EDITS, TAIL, MARK), (PREFILL_TARGET, PREFILL_EDITS, PREFILL_TAIL, PREFILL_MARK)]


def apply(site_dir: str | Path, plans=None) -> list[Path]:
    """Patch the sglang package under `site_dir` (default: nixl/conn.py and prefill.py); every file or none is
    written. `plans`: (target, edits, tail, mark) in order; a target named twice gets both patches."""
    texts: dict[Path, list[str]] = {}
    for target, edits, tail, mark in (PLANS if plans is None else plans):
        path = Path(site_dir) / target
        if not path.is_file():
            raise PatchError(f"{path} not found: pass the folder that holds the installed sglang package")
        pair = texts.setdefault(path, [path.read_text()] * 2)
        try:
            pair[1] = patch_text(pair[1], edits, tail, mark)
        except PatchError as exc:
            raise PatchError(f"{target}: {exc}") from None
    for path, (_, out) in texts.items():
        compile(out, str(path), "exec")
    for path, (src, out) in texts.items():
        if out != src:
            path.write_text(out)
            for cached in path.parent.glob(f"__pycache__/{path.stem}.*.pyc"):
                cached.unlink()
    return list(texts)
