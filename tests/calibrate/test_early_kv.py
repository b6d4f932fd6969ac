"""The early KV indices patch (orchestrator/calibrate/early_kv.py): applied to a module shaped like SGLang 0.5.17's and
to the real installed source when its archive is here; its host-side functions run on real (CPU) torch tensors."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections import deque
from types import SimpleNamespace

import pytest
import torch

from orchestrator.calibrate import early_kv, nixl_patch
from orchestrator.calibrate.pd import MODES, _flag_path, _set_mode
from tests.support import HAVE_SGLANG_SOURCE, NO_SGLANG_SOURCE, copy_sglang_source

def _shaped(edits) -> str:   # the two anchors at their real indentation: overlap loop, send_kv_chunk
    (loop, _), (send, _) = edits
    return ("import logging\nlogger = logging.getLogger(__name__)\n\n\nclass Scheduler:\n"
            "    def event_loop_overlap_disagg_prefill(self):\n        while True:\n            if batch:\n" + loop
            + "\n    def send_kv_chunk(self, req, start_idx, end_idx, page_size):\n" + send)


def test_patch_applies_once_to_a_shaped_module_and_refuses_a_changed_one():
    src = _shaped(early_kv.PREFILL_EDITS)
    out = nixl_patch.patch_text(src, early_kv.PREFILL_EDITS, early_kv.PREFILL_TAIL, early_kv.PREFILL_MARK)
    compile(out, "prefill.py", "exec")
    assert out.count("_pdo_snapshot_kv_rows(self)\n                self._apply_war_barrier()") == 1
    assert "        page_indices = _pdo_early_page_indices(self, req, start_idx, end_idx, page_size)\n" in out
    assert nixl_patch.patch_text(out, early_kv.PREFILL_EDITS, early_kv.PREFILL_TAIL, early_kv.PREFILL_MARK) == out
    with pytest.raises(nixl_patch.PatchError, match="edit 1: anchor found 0 times"):
        nixl_patch.patch_text(src.replace("start_idx:end_idx", "start_idx : end_idx"), early_kv.PREFILL_EDITS,
                              early_kv.PREFILL_TAIL, early_kv.PREFILL_MARK)


@pytest.mark.skipif(not HAVE_SGLANG_SOURCE, reason=NO_SGLANG_SOURCE)
def test_patch_applies_with_the_nixl_patch_to_the_installed_sglang_0_5_17_source(tmp_path):
    targets = (nixl_patch.TARGET, early_kv.PREFILL_TARGET, early_kv.RADIX_TARGET)
    copy_sglang_source(targets, tmp_path)
    srcs = {t: (tmp_path / t).read_text() for t in targets}
    plans = nixl_patch.PLANS + early_kv.PLANS
    assert nixl_patch.apply(tmp_path, plans) == [tmp_path / t for t in targets]
    subprocess.run([sys.executable, "-m", "py_compile", *(str(tmp_path / t) for t in targets)], check=True)
    prefill, radix = (tmp_path / early_kv.PREFILL_TARGET).read_text(), (tmp_path / early_kv.RADIX_TARGET).read_text()
    assert early_kv.PREFILL_MARK in prefill and nixl_patch.PREFILL_MARK in prefill and early_kv.RADIX_MARK in radix
    # the host copy sits after the launch of the next batch and before its WAR barrier, in the overlap loop only
    loop = prefill[prefill.index("def event_loop_overlap_disagg_prefill"):]
    loop = loop[:loop.index("\n    def ")]
    assert loop.index("self.run_batch(batch)") < loop.index("_pdo_snapshot_kv_rows(self)") \
        < loop.index("self._apply_war_barrier()")
    assert prefill.count("_pdo_snapshot_kv_rows(self)") == 1
    # SGLang's own lines stay, in order; the page-index read only moves under the `if page_indices is None:`
    for target in (early_kv.PREFILL_TARGET, early_kv.RADIX_TARGET):
        it = iter(line.strip() for line in (tmp_path / target).read_text().splitlines())
        kept = [line for line in srcs[target].splitlines() if line != "            copy_done.synchronize()"]
        assert all(any(line.strip() == o for o in it) for line in kept)   # (that wait: wrapped by nixl_patch)
    assert nixl_patch.apply(tmp_path, plans)    # idempotent
    assert (tmp_path / early_kv.PREFILL_TARGET).read_text() == prefill


def test_patch_is_all_or_nothing_across_files(tmp_path):
    (tmp_path / early_kv.PREFILL_TARGET).parent.mkdir(parents=True)
    (tmp_path / early_kv.PREFILL_TARGET).write_text(_shaped(early_kv.PREFILL_EDITS))
    (tmp_path / early_kv.RADIX_TARGET).parent.mkdir(parents=True)
    (tmp_path / early_kv.RADIX_TARGET).write_text("x = 1\n")   # radix anchor missing
    before = (tmp_path / early_kv.PREFILL_TARGET).read_text()
    with pytest.raises(nixl_patch.PatchError, match="radix_cache.py: nixl patch edit 0: anchor found 0 times"):
        nixl_patch.apply(tmp_path, early_kv.PLANS)
    assert (tmp_path / early_kv.PREFILL_TARGET).read_text() == before


class RadixCache:   # the patch uses the host copy only for SGLang's RadixCache / ChunkCache, named by type
    pass


def _scheduler(table, reqs):
    batch = SimpleNamespace(reqs=reqs)
    return SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=table), tree_cache=RadixCache(),
                           result_queue=deque([(batch, None)]), last_batch=batch)


def _req(pool_idx, n_in, end):
    return SimpleNamespace(req_pool_idx=pool_idx, origin_input_ids=list(range(n_in)),
                           extend_range=SimpleNamespace(end=end))


def _tail(monkeypatch, on: bool):
    monkeypatch.delenv("PDO_NIXL_EARLY_KV_INDICES", raising=False)
    monkeypatch.delenv("PDO_NIXL_EARLY_KV_INDICES_FILE", raising=False)
    monkeypatch.setenv("PDO_EARLY_KV_INDICES", "1" if on else "0")
    ns = {"logger": logging.getLogger("pdo-early-test")}
    exec(early_kv.PREFILL_TAIL, ns)
    return ns


def _stock(table, req, start, end, page):   # SGLang's kv_to_page_indices on the live row
    return (table[req.req_pool_idx, start:end][::page] // page).cpu().numpy()


@pytest.mark.parametrize("page", [1, 4])
def test_host_copy_gives_sglangs_pages_in_order(monkeypatch, page):
    ns = _tail(monkeypatch, on=True)
    table = torch.randperm(4 * 64, dtype=torch.int32).reshape(4, 64)
    done, chunked = _req(2, 40, 40), _req(1, 64, 48)   # chunked: its next chunk already scheduled to 48
    sched = _scheduler(table, [done, chunked])
    ns["_pdo_snapshot_kv_rows"](sched)
    for req, start, end in ((done, 0, 40), (done, 8, 37), (chunked, 0, 32), (chunked, 16, 48)):
        got = ns["_pdo_early_page_indices"](sched, req, start, end, page)
        want = _stock(table, req, start, end, page)
        assert got.dtype == want.dtype and got.tolist() == want.tolist()
    assert ns["_pdo_early_page_indices"](sched, chunked, 16, 49, page) is None   # past the copy: SGLang's path
    assert ns["_PDO_EARLY_COUNTS"] == [4, 1]


def test_host_copy_is_not_used_after_a_rewrite_a_new_batch_or_with_the_switch_off(monkeypatch):
    ns = _tail(monkeypatch, on=True)
    table = torch.arange(2 * 16, dtype=torch.int32).reshape(2, 16)
    req = _req(1, 16, 16)
    sched = _scheduler(table, [req])
    ns["_pdo_snapshot_kv_rows"](sched)
    table[1, :4] = 99                     # e.g. the radix insert found these tokens in the tree: row rewritten
    assert ns["_pdo_early_page_indices"](sched, req, 0, 16, 1).tolist() == list(range(16, 32))   # the copy
    req._pdo_kv_rewrites = 1              # ... which the patched cache_unfinished_req counts
    assert ns["_pdo_early_page_indices"](sched, req, 0, 16, 1) is None
    ns["_pdo_snapshot_kv_rows"](sched)    # a copy taken after the rewrite is used again
    assert ns["_pdo_early_page_indices"](sched, req, 0, 4, 1).tolist() == [99] * 4
    sched.last_batch = SimpleNamespace(reqs=[])   # the next iteration: the copy no longer serves
    assert ns["_pdo_early_page_indices"](sched, req, 0, 4, 1) is None
    sched.last_batch = sched.result_queue[0][0]
    req.req_pool_idx = 0                  # released and re-admitted elsewhere
    assert ns["_pdo_early_page_indices"](sched, req, 0, 4, 1) is None
    req.req_pool_idx = 1
    sched.tree_cache = SimpleNamespace()  # another tree cache (HiRadix, SWA, ...): SGLang's own path
    assert ns["_pdo_early_page_indices"](sched, req, 0, 4, 1) is None
    off = _tail(monkeypatch, on=False)
    sched.tree_cache = RadixCache()
    off["_pdo_snapshot_kv_rows"](sched)
    assert sched._pdo_kv_snaps == {} and off["_pdo_early_page_indices"](sched, req, 0, 4, 1) is None


def test_radix_edit_counts_only_rewriting_inserts():
    old, new = early_kv.RADIX_EDITS[0]
    body = new.replace("        self.token_to_kv_pool_allocator.free_segment(\n", "        return req\n")
    ns: dict = {}
    exec("def insert(req, result):\n" + body, ns)
    req = SimpleNamespace(cache_protected_len=32)
    ns["insert"](req, SimpleNamespace(prefix_len=32))
    assert not hasattr(req, "_pdo_kv_rewrites")
    ns["insert"](req, SimpleNamespace(prefix_len=48))
    ns["insert"](req, SimpleNamespace(prefix_len=48))
    assert req._pdo_kv_rewrites == 2


def test_early_mode_switches_the_patch_through_its_flag_file(tmp_path, monkeypatch):
    ns = _tail(monkeypatch, on=False)
    monkeypatch.setenv("PDO_NIXL_EARLY_KV_INDICES_FILE", str(_flag_path(tmp_path, "EARLY_KV_INDICES")))
    assert MODES["early"] == ("EARLY_KV_INDICES",)
    _set_mode(tmp_path, "early")
    assert ns["_pdo_early_on"]() and not _flag_path(tmp_path, "COALESCE").exists()
    _set_mode(tmp_path, "base")
    assert not ns["_pdo_early_on"]()
