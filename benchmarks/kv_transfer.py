"""KV transfer speed: NIXL WRITEs in SGLang's MLA descriptor layout against a plain copy of the same bytes.

    .venv/bin/python benchmarks/kv_transfer.py [--device cpu|cuda] [--model r1|v2-lite] [--tokens 4096]
        [--page-sizes 1,16,64] [--knobs default,rndv-get,rndv-put,thresh-8k,rails-1,rails-4,threads-4]

prefill process (source pool) --NIXL WRITE, one descriptor per page per layer--> decode process (target pool).
SGLang's MLA KV cache is one buffer per layer of [pages, page_size, 576] bf16, and its NIXL connector sends a
request's KV as one descriptor per (layer, page); the decode side's pages are wherever its allocator had room.
We model that with a target page table made of shuffled runs of `--run-pages` contiguous pages, and time:
- `prepped`: what SGLang 0.5.17 does for MLA (nixl/conn.py `_prep_equal_tp_dlist` + `make_prepped_xfer`):
  every (layer, page slot) of both pools prepared once, per request only slot indices (NIXL may merge
  neighbouring descriptors itself here);
- `per-page`: the same descriptors as fresh lists per request (`initialize_xfer`);
- `coalesced`: the same bytes with runs that are contiguous on both sides merged into one descriptor;
- the plain copy of the same number of bytes in the same run (CPU: one memcpy; GPU: torch peer copy
  cuda:0 -> cuda:1), which is the link's speed the transfer should approach.
UCX settings are environment variables read when the agent starts, so each knob runs in a fresh process pair.
Bytes are verified on the target after every case. Prints a markdown table (GB/s = 1e9 bytes/s).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from orchestrator.transfer.nixl import NIXL_MISSING, load_nixl_api
from orchestrator.provenance import recorded

LAYERS = {"r1": 61, "v2-lite": 27}  # DeepSeek-R1 / DeepSeek-V2-Lite MLA layers
ELEMS_PER_TOKEN = 576  # kv_lora_rank 512 + qk_rope_head_dim 64
BYTES_PER_ELEM = 2  # bf16

# knob name -> (UCX environment, NIXL num_threads); UCX_* unset = UCX's own defaults
KNOBS: dict[str, tuple[dict[str, str], int]] = {
    "default": ({}, 0),
    "rndv-get": ({"UCX_RNDV_SCHEME": "get_zcopy"}, 0),
    "rndv-put": ({"UCX_RNDV_SCHEME": "put_zcopy"}, 0),
    "thresh-8k": ({"UCX_RNDV_THRESH": "8192"}, 0),
    "thresh-inf": ({"UCX_RNDV_THRESH": "inf"}, 0),
    "rails-1": ({"UCX_MAX_RMA_RAILS": "1"}, 0),
    "rails-4": ({"UCX_MAX_RMA_RAILS": "4"}, 0),
    "threads-4": ({}, 4),
    "threads-8": ({}, 8),
}


@dataclass
class Layout:
    """Where one request's KV pages sit in the source and target pools (per layer, same page ids)."""

    layers: int
    page_bytes: int
    src_pages: np.ndarray  # page index in the source pool, in token order
    dst_pages: np.ndarray  # page index in the target pool, in token order
    pool_pages: int  # pages per layer in each pool

    @property
    def layer_bytes(self) -> int:
        return self.pool_pages * self.page_bytes

    @property
    def transfer_bytes(self) -> int:
        return self.layers * len(self.src_pages) * self.page_bytes


def make_layout(layers: int, tokens: int, page_size: int, run_pages: int, seed: int) -> Layout:
    """Source pages contiguous (a fresh prefill allocation); target pages in shuffled runs (a used decode pool)."""
    n = -(-tokens // page_size)
    pool = 2 * n + run_pages  # room to scatter the target runs
    rng = np.random.default_rng(seed)
    run_starts = rng.permutation(pool // run_pages)[: -(-n // run_pages)] * run_pages
    dst = np.concatenate([np.arange(s, s + run_pages) for s in run_starts])[:n]
    return Layout(layers, page_size * ELEMS_PER_TOKEN * BYTES_PER_ELEM, np.arange(n), dst, pool)


def descriptors(layout: Layout, base: int, pages: np.ndarray, device_id: int) -> np.ndarray:
    """SGLang's MLA layout: one (addr, len, dev) row per layer per page."""
    layer_offsets = np.arange(layout.layers, dtype=np.int64)[:, None] * layout.layer_bytes
    addrs = (base + layer_offsets + pages[None, :].astype(np.int64) * layout.page_bytes).reshape(-1)
    return np.stack([addrs, np.full_like(addrs, layout.page_bytes), np.full_like(addrs, device_id)], axis=1)


def coalesce(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge neighbouring rows that are contiguous on both sides into one longer descriptor."""
    if len(src) == 0:
        return src, dst
    breaks = (src[1:, 0] != src[:-1, 0] + src[:-1, 1]) | (dst[1:, 0] != dst[:-1, 0] + dst[:-1, 1])
    starts = np.concatenate([[0], np.nonzero(breaks)[0] + 1])
    lengths = np.add.reduceat(src[:, 1], starts)
    out_src, out_dst = src[starts].copy(), dst[starts].copy()
    out_src[:, 1] = lengths
    out_dst[:, 1] = lengths
    return out_src, out_dst


def load_nixl() -> ModuleType:
    api = load_nixl_api()
    if api is None:
        raise SystemExit(NIXL_MISSING)
    return api


def _pool(device: str, nbytes: int, fill: int | None = None):
    import torch

    if fill is None:
        return torch.zeros(nbytes, dtype=torch.uint8, device=device)
    return torch.full((nbytes,), fill, dtype=torch.uint8, device=device)


def _stamp(buf, layout: Layout) -> None:
    """Each source page gets a byte naming its (layer, page), so the target can check what landed where."""
    import torch

    view = buf.view(layout.layers, layout.pool_pages, layout.page_bytes)
    stamps = (torch.arange(layout.layers * layout.pool_pages, device=buf.device) % 251 + 1).to(torch.uint8)
    view.copy_(stamps.view(layout.layers, layout.pool_pages, 1).expand_as(view))


def target_main(conn, device: str, nbytes: int, num_threads: int) -> None:
    """Decode side: register the target pool, publish metadata, answer verification requests until told to stop."""
    import torch

    api = load_nixl()
    buf = _pool(device, nbytes)
    agent = api.nixl_agent("decode", api.nixl_agent_config(backends=["UCX"], num_threads=num_threads))
    agent.register_memory(buf)
    conn.send((agent.get_agent_metadata(), buf.data_ptr(), buf.device.index or 0))
    peer_meta = conn.recv()
    agent.add_remote_agent(peer_meta)
    while True:
        msg = conn.recv()
        if msg is None:
            break
        kind, payload = msg
        if kind == "zero":
            buf.zero_()
            if buf.is_cuda:  # the next WRITE must not race the zeroing kernel
                torch.cuda.synchronize(buf.device)
            conn.send("zeroed")
        elif kind == "check":  # [(offset, expected byte)]: first and last byte of sampled pages
            if buf.is_cuda:
                torch.cuda.synchronize(buf.device)
            host = buf.cpu().numpy() if buf.is_cuda else buf.numpy()
            bad = [(off, int(host[off]), exp) for off, exp in payload if int(host[off]) != exp]
            conn.send(bad[:3])
    conn.send("bye")


def _post(agent, local, remote, peer: str) -> None:
    _wait(agent, agent.initialize_xfer("WRITE", local, remote, peer, b""))


def _wait(agent, handle) -> None:
    state = agent.transfer(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    agent.release_xfer_handle(handle)
    if state != "DONE":
        raise RuntimeError(f"NIXL WRITE ended in state {state}")


def initiator_main(conn, device: str, layouts: list[Layout], num_threads: int, iters: int, result_conn) -> None:
    """Prefill side: for each page size, time per-page and coalesced WRITEs; verify bytes after each."""
    import torch

    api = load_nixl()
    nbytes = max(lay.layers * lay.layer_bytes for lay in layouts)
    meta, remote_base, remote_dev = conn.recv()
    agent = api.nixl_agent("prefill", api.nixl_agent_config(backends=["UCX"], num_threads=num_threads))
    buf = _pool(device, nbytes)
    agent.register_memory(buf)
    peer = agent.add_remote_agent(meta)
    peer = peer.decode() if isinstance(peer, bytes) else str(peer)
    conn.send(agent.get_agent_metadata())
    mem = "VRAM" if buf.is_cuda else "DRAM"
    local_dev = buf.device.index or 0
    rows = []
    for lay in layouts:
        _stamp(buf[: lay.layers * lay.layer_bytes], lay)
        if buf.is_cuda:
            torch.cuda.synchronize(buf.device)
        src = descriptors(lay, buf.data_ptr(), lay.src_pages, local_dev)
        dst = descriptors(lay, remote_base, lay.dst_pages, remote_dev)
        # SGLang's MLA path: every (layer, page slot) of both pools prepared once at start-up, then per
        # request make_prepped_xfer with slot indices (layer-major, as repeat_indices_over_layers gives)
        all_pages = np.arange(lay.pool_pages)
        src_prep = agent.prep_xfer_dlist("NIXL_INIT_AGENT", descriptors(lay, buf.data_ptr(), all_pages, local_dev), mem)
        dst_prep = agent.prep_xfer_dlist(peer, descriptors(lay, remote_base, all_pages, remote_dev), mem)
        layer_base = np.arange(lay.layers, dtype=np.int64)[:, None] * lay.pool_pages
        src_idx = (layer_base + lay.src_pages[None, :]).reshape(-1).astype(np.int32)
        dst_idx = (layer_base + lay.dst_pages[None, :]).reshape(-1).astype(np.int32)
        for mode in ("prepped", "per-page", "coalesced"):
            conn.send(("zero", None))
            conn.recv()
            times, post_times = [], []
            for _ in range(iters + 1):  # first one warms connections and registration caches
                t0 = time.perf_counter()
                if mode == "prepped":
                    s = src_idx
                    t1 = time.perf_counter()
                    handle = agent.make_prepped_xfer("WRITE", src_prep, src_idx, dst_prep, dst_idx, b"")
                    _wait(agent, handle)
                    t2 = time.perf_counter()
                    times.append(t2 - t0)
                    post_times.append(t2 - t1)
                    continue
                s, d = coalesce(src, dst) if mode == "coalesced" else (src, dst)
                local = agent.get_xfer_descs(s, mem)
                remote = agent.get_xfer_descs(d, mem)
                t1 = time.perf_counter()
                _post(agent, local, remote, peer)
                t2 = time.perf_counter()
                times.append(t2 - t0)
                post_times.append(t2 - t1)
            conn.send(("check", _checks(lay)))
            bad = conn.recv()
            if bad:
                raise RuntimeError(f"page size {lay.page_bytes}: wrong bytes on the target (offset, got, want): {bad}")
            rows.append({"page_bytes": lay.page_bytes, "mode": mode, "descs": len(s), "bytes": lay.transfer_bytes,
                         "s": statistics.median(times[1:]), "post_s": statistics.median(post_times[1:]),
                         "backend": "UCX"})
        agent.release_dlist_handle(src_prep)
        agent.release_dlist_handle(dst_prep)
    conn.send(None)
    conn.recv()
    result_conn.send(rows)


def _checks(lay: Layout) -> list[tuple[int, int]]:
    """Expected first/last byte of a spread of (layer, page) pairs at their target offsets."""
    out = []
    for layer in sorted({0, lay.layers // 2, lay.layers - 1}):
        for i in sorted({0, len(lay.src_pages) // 3, len(lay.src_pages) - 1}):
            want = (layer * lay.pool_pages + int(lay.src_pages[i])) % 251 + 1
            start = layer * lay.layer_bytes + int(lay.dst_pages[i]) * lay.page_bytes
            out += [(start, want), (start + lay.page_bytes - 1, want)]
    return out


def run_knob(knob: str, device: str, layouts: list[Layout], iters: int) -> list[dict]:
    """One process pair with the knob's environment; returns the initiator's timed rows."""
    env, threads = KNOBS[knob]
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    res_recv, res_send = ctx.Pipe(duplex=False)
    nbytes = max(lay.layers * lay.layer_bytes for lay in layouts)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # spawned children copy the environment at start; UCX reads it then
    try:
        src_dev, dst_dev = ("cuda:0", "cuda:1") if device == "cuda" else ("cpu", "cpu")
        target = ctx.Process(target=target_main, args=(b, dst_dev, nbytes, threads), daemon=True)
        init = ctx.Process(target=initiator_main, args=(a, src_dev, layouts, threads, iters, res_send), daemon=True)
        target.start()
        init.start()
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    rows = res_recv.recv() if res_recv.poll(600) else None
    init.join(30)
    target.join(30)
    for p in (init, target):
        if p.is_alive():
            p.kill()
    if rows is None:
        raise RuntimeError(f"knob {knob}: no result (initiator exit code {init.exitcode}, target {target.exitcode})")
    return [dict(r, knob=knob) for r in rows]


def plain_copy_gbs(device: str, nbytes: int, iters: int) -> float:
    """The link's speed for the same bytes: memcpy on CPU, torch peer copy cuda:0 -> cuda:1 on GPU."""
    import torch

    if device == "cuda":
        src = torch.ones(nbytes, dtype=torch.uint8, device="cuda:0")
        dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    else:
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty(nbytes, dtype=torch.uint8)
    times = []
    for _ in range(iters + 1):
        if device == "cuda":
            torch.cuda.synchronize("cuda:0")
            torch.cuda.synchronize("cuda:1")
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=False)
        if device == "cuda":
            torch.cuda.synchronize("cuda:1")
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times[1:]) / 1e9


def machine_line(device: str) -> str:
    import torch

    if device == "cuda":
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        return f"{names}; torch {torch.__version__}"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU memory, UCX_NET_DEVICES={os.environ.get('UCX_NET_DEVICES', '')}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model", choices=sorted(LAYERS), default="r1")
    parser.add_argument("--tokens", type=int, default=4096, help="prompt tokens whose KV one transfer moves")
    parser.add_argument("--page-sizes", default="1,16,64")
    parser.add_argument("--run-pages", type=int, default=8, help="target pages come in contiguous runs of this many")
    parser.add_argument("--knobs", default="default,rndv-get,rndv-put,thresh-8k,rails-1,rails-4,threads-4",
                        help=f"comma-separated, from: {', '.join(KNOBS)}")
    parser.add_argument("--iters", type=int, default=3, help="timed transfers per case (median), after one warm-up")
    parser.add_argument("--out", type=Path, default=None, help="results folder: manifest.json + stdout in output.txt")
    args = parser.parse_args()
    with recorded(args.out):
        knobs = args.knobs.split(",")
        for k in knobs:
            if k not in KNOBS:
                raise SystemExit(f"--knobs: unknown knob {k!r}; choose from {', '.join(KNOBS)}")
        if args.device == "cpu":
            os.environ.setdefault("UCX_NET_DEVICES", "lo")
        layers = LAYERS[args.model]
        layouts = [make_layout(layers, args.tokens, int(p), args.run_pages, seed=2025) for p in args.page_sizes.split(",")]
        nbytes = layouts[0].transfer_bytes
        copy_gbs = plain_copy_gbs(args.device, nbytes, max(args.iters, 3))
        rows = []
        for knob in knobs:
            got = run_knob(knob, args.device, layouts, args.iters)
            rows += got
            for r in got:  # partial results survive a run cut short
                print(f"{knob} page {r['page_bytes']} B {r['mode']}: {r['bytes'] / r['s'] / 1e9:.2f} GB/s "
                      f"(copy {copy_gbs:.2f})", file=sys.stderr, flush=True)
        copy_after = plain_copy_gbs(args.device, nbytes, max(args.iters, 3))  # bracket: the machine is shared
        print(f"\nKV transfer, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine_line(args.device)}; "
              f"{args.model}: {layers} layers x {ELEMS_PER_TOKEN} x {BYTES_PER_ELEM} B, {args.tokens} tokens = "
              f"{nbytes / 1e6:.1f} MB per transfer; target pages in runs of {args.run_pages}; median of {args.iters}.")
        print(f"Plain copy of the same bytes ({'torch cuda:0 -> cuda:1' if args.device == 'cuda' else 'memcpy'}): "
              f"{copy_gbs:.2f} GB/s before, {copy_after:.2f} GB/s after; ratios use the mean {((copy_gbs + copy_after) / 2):.2f}.\n")
        ref = (copy_gbs + copy_after) / 2
        print("| knob | page size (tokens) | descriptors | mode | GB/s (incl. descriptor build) | ratio | GB/s (post only) | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            page_tokens = r["page_bytes"] // (ELEMS_PER_TOKEN * BYTES_PER_ELEM)
            gbs, post_gbs = r["bytes"] / r["s"] / 1e9, r["bytes"] / r["post_s"] / 1e9
            print(f"| {r['knob']} | {page_tokens} | {r['descs']} | {r['mode']} | {gbs:.2f} | {gbs / ref:.2f}x "
                  f"| {post_gbs:.2f} | {post_gbs / ref:.2f}x |")
        return 0


if __name__ == "__main__":
    sys.exit(main())
