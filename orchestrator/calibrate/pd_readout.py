"""What a PD calibration load is read as: the prefill's `sglang:kv_transfer_*` histogram deltas (Prometheus text),
the patched sender's per-chunk `PDO_NIXL` lines, each sender mode's summary over its loads, and the top-k logprob
agreement between two runs of the same prompts (with a cross-prompt control: what a wrong KV would look like)."""

from __future__ import annotations

import re

from . import kvtimeline

_CHUNK = re.compile(r"PDO_NIXL room=(\d+) chunk=(\d+) last=(\d) slots=(\d+) item_bytes=(\d+) descs=(\d+) "
                    r"bytes=(\d+) mode=(\w+) post_ms=([\d.]+) wait_ms=([\d.]+)")
KV_HISTOGRAMS = ("kv_transfer_latency_ms", "kv_transfer_speed_gb_s", "kv_transfer_total_mb",
                 "kv_transfer_bootstrap_ms", "kv_transfer_alloc_ms")


def prom_sums(text: str) -> dict[str, float]:
    """Sum of every sample per metric name (labels dropped) from Prometheus text format."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].split(":", 1)[-1]
        try:
            sums[name] = sums.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return sums


def kv_delta(before: dict, after: dict) -> dict:
    out = {}
    for h in KV_HISTOGRAMS:
        n = after.get(h + "_count", 0.0) - before.get(h + "_count", 0.0)
        s = after.get(h + "_sum", 0.0) - before.get(h + "_sum", 0.0)
        out[h + "_count"] = n
        out[h + "_mean"] = round(s / n, 4) if n else None
    for c in ("num_transfer_failed_reqs_total", "num_bootstrap_failed_reqs_total"):
        out[c] = after.get(c, 0.0) - before.get(c, 0.0)
    return out


def chunk_stats(text: str) -> dict:
    rows = [m.groups() for m in _CHUNK.finditer(text)]
    if not rows:
        return {"chunks": 0}
    descs = [int(r[5]) for r in rows]
    nbytes = [int(r[6]) for r in rows]
    post = [float(r[8]) for r in rows]
    wait = [float(r[9]) for r in rows]
    per_req: dict[str, list[float]] = {}
    for r in rows:
        per_req.setdefault(r[0], []).append(float(r[8]) + float(r[9]))
    req_ms = sorted(sum(v) for v in per_req.values())

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2]
    return {"chunks": len(rows), "requests": len(per_req), "modes": sorted({r[7] for r in rows}),
            "slots_mean": sum(int(r[3]) for r in rows) / len(rows), "item_bytes": int(rows[0][4]),
            "descs_mean": sum(descs) / len(rows), "bytes_mean": sum(nbytes) / len(rows),
            "post_ms_median": med(post), "wait_ms_median": med(wait),
            "transfer_ms_per_request_median": req_ms[len(req_ms) // 2],
            "transfer_ms_per_request_p90": req_ms[int(0.9 * (len(req_ms) - 1))],
            "bytes_per_request_mean": sum(nbytes) / len(per_req),
            "gb_s_worker": round(sum(nbytes) / max(1e-9, sum(post) + sum(wait)) / 1e6, 4)}


def top_logprobs(summary: dict) -> list:
    """Per prompt: [[(token_id, logprob) x k] per output step] from meta_info.output_top_logprobs."""
    out = []
    for r in summary["rows"]:
        meta = (r["body"] or {}).get("meta_info", {})
        steps = []
        for step in meta.get("output_top_logprobs") or []:
            steps.append([(int(t[1]), float(t[0])) for t in (step or []) if t and t[0] is not None])
        ids = (r["body"] or {}).get("output_ids") or []
        # PD answers may lack the first token's entry (sampled on the prefill server): align to the end
        steps = [[] for _ in range(max(0, len(ids) - len(steps)))] + steps
        out.append({"output_ids": ids, "top": steps})
    return out


def compare_logprobs(a: list, b: list, steps: int) -> dict:
    """Max |logprob difference| over shared top-k ids of the first `steps` steps, top-1 agreement, overlap."""
    max_diff, top1_same, n_steps, overlap = 0.0, 0, 0, []
    for pa, pb in zip(a, b):
        for sa, sb in zip(pa["top"][:steps], pb["top"][:steps]):
            if not sa or not sb:
                continue
            n_steps += 1
            da, db = dict(sa), dict(sb)
            shared = set(da) & set(db)
            overlap.append(len(shared) / max(len(da), 1))
            top1_same += sa[0][0] == sb[0][0]
            for t in shared:
                max_diff = max(max_diff, abs(da[t] - db[t]))
    return {"steps_compared": n_steps, "max_abs_logprob_diff": max_diff, "top1_agree": top1_same,
            "topk_overlap_mean": round(sum(overlap) / len(overlap), 4) if overlap else None}


def cross_prompt_control(a: list, steps: int) -> dict:
    """The same metric between DIFFERENT prompts of one server: what a wrong KV would look like."""
    shifted = a[1:] + a[:1]
    return compare_logprobs(a, shifted, steps)


def by_mode(loads: list[dict]) -> dict:
    """Per mode over its reps: wall and throughput means, and the median over loads of each timeline p50/p90."""
    out: dict[str, dict] = {}
    for mode in dict.fromkeys(x["mode"] for x in loads if "wall_s" in x):
        ls = [x for x in loads if x["mode"] == mode and "wall_s" in x]
        row = {"loads": len(ls), "wall_s": [x["wall_s"] for x in ls],
               "wall_s_mean": round(sum(x["wall_s"] for x in ls) / len(ls), 3),
               "output_tok_s_mean": round(sum(x["output_tok_s"] or 0 for x in ls) / len(ls), 1),
               "sglang_kv_latency_ms_mean": [x["sglang_kv"]["kv_transfer_latency_ms_mean"] for x in ls]}
        for part in kvtimeline.PARTS:
            for q in ("p50", "p90"):
                vals = [x["timeline"][part][q] for x in ls if x["timeline"][part][q] is not None]
                row[f"{part}_{q}_median"] = kvtimeline.pct(vals, 0.5)
        out[mode] = row
    return out
