"""Per-request KV-transfer timelines from the `nixl_patch` log lines of a prefill and a decode server.

The patched prefill logs one `PDO_NIXL` line per KV chunk (wall times of enqueue, worker pop and done, the
queue and how many chunks were ahead) and a `PDO_KV event=prefill_polled` line when its scheduler's poll
first sees the request's transfer done; the patched decode logs `PDO_KV event=decode_seen` when its
scheduler's poll sees every chunk and the aux data. Both servers run on one host, so wall times compare.

Per request (times in ms):
  ready_to_seen   last chunk enqueued (its KV is computed) -> decode scheduler sees the transfer done:
                  the transfer time a decode's time to first token pays
  queue           last chunk: enqueue -> a transfer worker takes it
  worker          last chunk: worker takes it -> NIXL reports every handle DONE (post + wait, aux included)
  decode_notice   last chunk DONE -> decode scheduler's poll sees it
  prefill_notice  last chunk DONE -> prefill scheduler's poll sees it
  sglang_like     first chunk enqueued -> prefill poll sees it: what `kv_transfer_latency_ms` measures
  worker_all      post + wait summed over all the request's chunks (NIXL's own time)
  computed_to_seen  the forward that computed the last chunk's KV was seen done (`PDO_READY`) -> decode sees
                  the transfer done: the whole per-request transfer time, SGLang's own wait to send included
  send_delay      that forward seen done -> last chunk enqueued (SGLang sends a batch's KV while processing
                  its result; in the overlap loop that waits for the next batch)
"""

from __future__ import annotations

import re

from orchestrator.calibrate.logparse import timestamped

_CHUNK = re.compile(r"PDO_NIXL room=(\d+) chunk=(\d+) last=(\d) slots=(\d+) item_bytes=\d+ descs=(\d+) "
                    r"bytes=(\d+) mode=(\w+) post_ms=([\d.]+) wait_ms=([\d.]+) queue=(-?\d+) depth=(-?\d+) "
                    r"shard=(\w+) t_enq=([\d.]+) t_pop=([\d.]+) t_done=([\d.]+)")
_EVENT = re.compile(r"PDO_KV event=(\w+) room=(\d+) t=([\d.]+)")
_READY = re.compile(r"PDO_READY t=([\d.]+) rooms=([\d,None]+)")

PARTS = ("ready_to_seen", "queue", "worker", "decode_notice", "prefill_notice", "sglang_like", "worker_all",
         "computed_to_seen", "send_delay")


def chunks(text: str) -> list[dict]:
    out = []
    for m in _CHUNK.finditer(text):
        g = m.groups()
        out.append({"room": g[0], "chunk": int(g[1]), "last": g[2] == "1", "slots": int(g[3]),
                    "descs": int(g[4]), "bytes": int(g[5]), "mode": g[6], "post_ms": float(g[7]),
                    "wait_ms": float(g[8]), "queue": int(g[9]), "depth": int(g[10]), "shard": g[11],
                    "t_enq": float(g[12]), "t_pop": float(g[13]), "t_done": float(g[14])})
    return out


def events(text: str, name: str) -> dict[str, float]:
    """room -> wall time of the first `name` event."""
    seen: dict[str, float] = {}
    for m in _EVENT.finditer(text):
        if m.group(1) == name:
            seen.setdefault(m.group(2), float(m.group(3)))
    return seen


def ready_times(text: str) -> dict[str, list[tuple[float, frozenset]]]:
    """room -> [(wall time a batch holding it was seen done, that batch's rooms)], in log order."""
    out: dict[str, list[tuple[float, frozenset]]] = {}
    for m in _READY.finditer(text):
        rooms = frozenset(m.group(2).split(","))
        for room in rooms:
            out.setdefault(room, []).append((float(m.group(1)), rooms))
    return out


def computed_at(seen: list[tuple[float, frozenset]], t_enq: float) -> float | None:
    """When the batch that computed the last chunk was first seen done: of the batches seen done before the
    last chunk was enqueued, the latest one (by its rooms), at the earliest time it was seen."""
    before = [(t, rooms) for t, rooms in seen if t <= t_enq]
    if not before:
        return None
    batch = before[-1][1]
    return min(t for t, rooms in before if rooms == batch)


def requests(prefill_text: str, decode_text: str) -> list[dict]:
    """One row per request whose last chunk was logged; missing events leave their parts None."""
    by_room: dict[str, list[dict]] = {}
    for c in chunks(prefill_text):
        by_room.setdefault(c["room"], []).append(c)
    polled = events(prefill_text, "prefill_polled")
    seen = events(decode_text, "decode_seen")
    ready = ready_times(prefill_text)
    rows = []
    for room, cs in by_room.items():
        last = [c for c in cs if c["last"]]
        if not last:
            continue
        last_c = last[-1]
        enq_first = min(c["t_enq"] for c in cs if c["t_enq"] > 0) if any(c["t_enq"] > 0 for c in cs) else None
        computed = computed_at(ready.get(room, []), last_c["t_enq"])

        def ms(a, b):
            return None if a is None or b is None or a <= 0 or b <= 0 else round((b - a) * 1000.0, 3)
        rows.append({"room": room, "chunks": len(cs), "bytes": sum(c["bytes"] for c in cs),
                     "descs": sum(c["descs"] for c in cs), "queue_index": last_c["queue"],
                     "depth": last_c["depth"], "mode": last_c["mode"], "shard": last_c["shard"],
                     "ready_to_seen": ms(last_c["t_enq"], seen.get(room)),
                     "queue": ms(last_c["t_enq"], last_c["t_pop"]),
                     "worker": ms(last_c["t_pop"], last_c["t_done"]),
                     "decode_notice": ms(last_c["t_done"], seen.get(room)),
                     "prefill_notice": ms(last_c["t_done"], polled.get(room)),
                     "sglang_like": ms(enq_first, polled.get(room)),
                     "worker_all": round(sum(c["post_ms"] + c["wait_ms"] for c in cs), 3),
                     "computed_to_seen": ms(computed, seen.get(room)),
                     "send_delay": ms(computed, last_c["t_enq"])})
    return rows


def pct(xs: list[float], q: float) -> float | None:
    """Percentile (q in 0..1) of the non-None values: the value at rank q x (n - 1), rounded half up."""
    v = sorted(x for x in xs if x is not None)
    if not v:
        return None
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


def summary(rows: list[dict]) -> dict:
    out = {"requests": len(rows),
           "queues_used": sorted({r["queue_index"] for r in rows}),
           "modes": sorted({f"{r['mode']}/{r['shard']}" for r in rows}),
           "descs_per_request_mean": round(sum(r["descs"] for r in rows) / len(rows), 1) if rows else None,
           "bytes_per_request_mean": round(sum(r["bytes"] for r in rows) / len(rows)) if rows else None}
    for part in PARTS:
        xs = [r[part] for r in rows if r[part] is not None]
        out[part] = {"n": len(xs), "p50": pct(xs, 0.5), "p90": pct(xs, 0.9),
                     "mean": round(sum(xs) / len(xs), 3) if xs else None, "max": max(xs) if xs else None}
    return out


_ITER = re.compile(r"PDO_ITER sched_ms=(-?[\d.]+) run_ms=(-?[\d.]+) gap_ms=(-?[\d.]+) result_ms=(-?[\d.]+) "
                   r"poll_ms=(-?[\d.]+) tail_ms=(-?[\d.]+) running_done_at_top=(-?\d+) wait_ms=(-?[\d.]+) "
                   r"polls=(\d+) inflight=(\d+)")
ITER_PARTS = ("sched_ms", "run_ms", "gap_ms", "result_ms", "poll_ms", "tail_ms", "wait_ms")


def iteration_lines(text: str) -> list[dict]:
    """Every `PDO_ITER` line in log order: its parts (ITER_PARTS, ms), `inflight`, and the line's stamp (`t`, epoch
    s at the log's 1 s resolution, read as logparse reads stamps). A line describes the last iteration that ran a
    batch, logged at the top of the next one."""
    out = []
    for ts, msg in timestamped(text):
        if m := _ITER.search(msg):
            g = m.groups()
            row: dict = {"t": ts, "inflight": int(g[9])}
            row.update({name: float(g[i]) for i, name in enumerate(ITER_PARTS[:6])})
            row["wait_ms"] = float(g[7])
            out.append(row)
    return out


def iterations(text: str) -> dict:
    """The prefill loop's iterations that ran a batch (`PDO_ITER` lines): medians of where the time went,
    and how often the running batch had already finished when the next iteration began."""
    rows = [m.groups() for m in _ITER.finditer(text)]
    out: dict = {"iterations": len(rows)}
    if not rows:
        return out
    for i, name in enumerate(ITER_PARTS[:6]):
        out[name + "_p50"] = pct([float(r[i]) for r in rows], 0.5)
    out["wait_ms_p50"] = pct([float(r[7]) for r in rows], 0.5)
    done = [int(r[6]) for r in rows if int(r[6]) >= 0]
    out["running_done_at_top_frac"] = round(sum(done) / len(done), 3) if done else None
    out["polls_total"] = sum(int(r[8]) for r in rows)
    return out
