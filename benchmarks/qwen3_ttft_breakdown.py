"""Where a PD request's TTFT went, per request, from the raw archives of a `serve` + `goodput` run with the NIXL patch.

    .venv/bin/python benchmarks/qwen3_ttft_breakdown.py benchmarks/results/2026-11-26-qwen3-serve-one-h100/serve-call9.tar.xz ...

Reads, from each archive: AIPerf's per-request records (`profile_export.jsonl` of c4 and c16: send time, TTFT, end),
the prefill server's log (`PDO_NIXL` per KV chunk: enqueue, worker pop and done wall times; `PDO_READY`: the forward
that computed a request's KV seen done) and the decode server's log (`PDO_KV event=decode_seen`), all wall clock on
one host (orchestrator/calibrate/nixl_patch.py writes them). A request is matched to its bootstrap room by the
decode's `decode_seen` time: the latest unused room seen between the request's send and its first token.

Every prompt shares a 10-token prefix with the others (a radix-cache hit), so SGLang sends each request's KV in two
chunks: chunk 0 (the 10 cached tokens) when its prefill batch is scheduled, chunk 1 (the rest) after its forward. Per
request (ms): send -> scheduled (gateway, tokenizer, bootstrap with the decode's pre-allocation, waiting in the
prefill queue) | forward (scheduled -> its forward seen done) | hold (seen done -> last chunk enqueued: SGLang's
overlap loop sends a batch's KV while processing its result, after the next batch was launched) | queue (enqueued ->
the one transfer worker takes it) | nixl (worker: post + wait) | notice (done -> the decode's poll sees it) | first
token (decode sees it -> AIPerf's first token: the decode's next step and the stream back).

Second table: the prefill forwards that ran alone on the prefill server (the previous batch was done before this one
was scheduled), by how many requests the decode server was decoding meanwhile (from AIPerf's first token .. end of
every request): what a prefill forward costs with the GPU to itself and beside the decode's steps.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import re
import statistics
import sys
import tarfile
from pathlib import Path

READY = re.compile(r"PDO_READY t=([\d.]+) rooms=([\d,]+)")
CHUNK = re.compile(r"PDO_NIXL room=(\d+) chunk=(\d+) last=(\d) slots=(\d+) .*?t_enq=([\d.]+) t_pop=([\d.]+) t_done=([\d.]+)")
SEEN = re.compile(r"PDO_KV event=decode_seen room=(\d+) t=([\d.]+)")
PARTS = ("ttft", "send_to_scheduled", "forward", "hold", "queue", "nixl", "notice", "first_token")


def members(archive: Path) -> dict[str, str]:
    """name -> text of the logs and AIPerf records in `archive`."""
    out = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = member.name
            stream = tar.extractfile(member)
            if stream is not None and name.endswith((".log", "profile_export.jsonl")) and "aiperf.log" not in name:
                out[name] = io.TextIOWrapper(stream, encoding="utf-8").read()
    return out


def one(files: dict[str, str], pattern: str) -> str:
    found = [text for name, text in files.items() if re.search(pattern, name)]
    if len(found) != 1:
        raise SystemExit(f"expected one file matching {pattern!r}, found {len(found)}")
    return found[0]


def timeline(prefill_log: str, decode_log: str) -> tuple[dict, dict, dict, dict]:
    ready: dict[str, float] = {}
    for m in READY.finditer(prefill_log):
        for room in m.group(2).split(","):
            ready.setdefault(room, float(m.group(1)))  # the first time its forward was seen done
    first: dict[str, tuple] = {}
    last: dict[str, tuple] = {}
    for m in CHUNK.finditer(prefill_log):
        room, chunk, is_last = m.group(1), int(m.group(2)), m.group(3) == "1"
        times = tuple(float(x) for x in m.group(5, 6, 7))
        if chunk == 0:
            first[room] = (*times, is_last)
        if is_last:
            last[room] = times
    seen = {m.group(1): float(m.group(2)) for m in SEEN.finditer(decode_log)}
    return ready, first, last, seen


def records(files: dict[str, str], n: int) -> list[dict]:
    text = one(files, rf"/c{n}/profile_export\.jsonl$")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def breakdown(recs: list[dict], ready: dict, first: dict, last: dict, seen: dict) -> list[dict[str, float]]:
    rooms = sorted(seen, key=lambda room: seen[room])
    used: set[str] = set()
    rows = []
    profiled = [r for r in recs if r["metadata"]["benchmark_phase"] == "profiling" and "time_to_first_token" in r["metrics"]]
    for r in sorted(profiled, key=lambda r: r["metadata"]["request_start_ns"] / 1e9 + r["metrics"]["time_to_first_token"]["value"] / 1e3):
        sent = r["metadata"]["request_start_ns"] / 1e9
        ttft = r["metrics"]["time_to_first_token"]["value"] / 1e3
        candidates = [x for x in rooms if x not in used and sent < seen[x] < sent + ttft and x in ready and x in first and x in last]
        if not candidates:
            continue
        room = max(candidates, key=lambda x: seen[x])
        used.add(room)
        if first[room][3]:  # one chunk only: no mark of when its batch was scheduled
            continue
        enq, pop, done = last[room]
        rows.append({"ttft": ttft, "send_to_scheduled": first[room][0] - sent, "forward": ready[room] - first[room][0],
                     "hold": enq - ready[room], "queue": pop - enq, "nixl": done - pop, "notice": seen[room] - done,
                     "first_token": sent + ttft - seen[room]})
    return [{k: v * 1e3 for k, v in row.items()} for row in rows]


def lone_forwards(recs: list[dict], ready: dict, first: dict) -> dict[tuple[int, int], list[float]]:
    """(requests in the batch, requests decoding meanwhile, rounded) -> forward ms, for forwards that ran alone."""
    decoding = [(r["metadata"]["request_start_ns"] / 1e9 + r["metrics"]["time_to_first_token"]["value"] / 1e3,
                 r["metadata"]["request_end_ns"] / 1e9) for r in recs if "time_to_first_token" in r["metrics"]]
    batches: dict[float, list[str]] = collections.defaultdict(list)
    for room, t in ready.items():
        if room in first:
            batches[t].append(room)
    times = sorted(batches)
    out: dict[tuple[int, int], list[float]] = collections.defaultdict(list)
    for i, done in enumerate(times):
        rooms = batches[done]
        scheduled = min(first[r][0] for r in rooms)
        if any(first[r][3] for r in rooms) or (i and times[i - 1] > scheduled):
            continue  # a one-chunk request, or the previous batch was still running when this one was scheduled
        span = done - scheduled
        busy = sum(max(0.0, min(b, done) - max(a, scheduled)) for a, b in decoding) / span
        out[(len(rooms), round(busy))].append(span * 1e3)
    return out


def quantiles(values: list[float]) -> str:
    deciles = statistics.quantiles(values, n=10)
    return f"{deciles[0]:8.1f} {statistics.median(values):8.1f} {deciles[-1]:8.1f} {statistics.mean(values):8.1f}"


def report(archive: Path) -> str:
    files = members(archive)
    ready, first, last, seen = timeline(one(files, r"prefill[^/]*\.log$"), one(files, r"decode[^/]*\.log$"))
    lines = [f"== {archive.name}"]
    all_recs = []
    for n in (4, 16):
        recs = records(files, n)
        all_recs += recs
        rows = breakdown(recs, ready, first, last, seen)
        lines.append(f"N={n}: {len(rows)} profiled requests matched to their room; ms: p10 / p50 / p90 / mean")
        lines += [f"  {part:18s} {quantiles([r[part] for r in rows])}" for part in PARTS]
    lines.append("prefill forwards that ran alone on the prefill server (warm-up and profiling, both N), by requests decoding meanwhile:")
    by_shape = lone_forwards(all_recs, ready, first)
    for batch in sorted({b for b, _ in by_shape}):
        idle = by_shape.get((batch, 0), [])
        busy = [v for (b, d), vs in by_shape.items() if b == batch and d > 0 for v in vs]
        lines.append(f"  {batch} request(s) of ~4,000 tokens: decode idle n={len(idle)} median "
                     f"{statistics.median(idle) if idle else float('nan'):.1f} ms; decode busy (1-15 decoding) n={len(busy)} "
                     f"median {statistics.median(busy) if busy else float('nan'):.1f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("archives", nargs="+", type=Path, help="serve-call*.tar.xz / router-call*.tar.xz of a results folder")
    args = p.parse_args(argv)
    for archive in args.archives:
        print(report(archive) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
