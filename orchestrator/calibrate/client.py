"""Blocking /generate calls with token ids (stdlib only), many at once on threads."""

from __future__ import annotations

import http.client
import json
import random
import time
import urllib.parse
from typing import Any
from concurrent.futures import ThreadPoolExecutor


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    # Ids away from the special tokens at both ends; every prompt distinct, so no prefix-cache hits.
    return [rng.randrange(100, vocab - 100) for _ in range(n)]


def post_json(url: str, body: dict, timeout_s: float = 600.0) -> tuple[int, dict | str, float]:
    """POST `body` to `url`; returns (HTTP status, parsed JSON or text, seconds)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=timeout_s)
    data = json.dumps(body).encode()
    t0 = time.perf_counter()
    try:
        conn.request("POST", u.path, body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        dt = time.perf_counter() - t0
        try:
            return r.status, json.loads(raw), dt
        except ValueError:
            return r.status, raw.decode(errors="replace")[:500], dt
    except (OSError, http.client.HTTPException) as exc:   # a server that died mid-request is a result too
        return 0, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0
    finally:
        conn.close()


def generate_body(input_ids: list[int], max_new_tokens: int, logprobs: int = 0, **extra) -> dict:
    body: dict[str, Any] = {"input_ids": input_ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0}}
    if logprobs:
        body.update(return_logprob=True, top_logprobs_num=logprobs, logprob_start_len=-1)
    body.update(extra)
    return body


def run_many(calls: list, workers: int | None = None) -> tuple[list, float]:
    """Run zero-argument callables at once (one thread each, up to `workers`); (results, wall seconds)."""
    if not calls:
        return [], 0.0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(len(calls), workers or 1024)) as pool:
        futures = [pool.submit(c) for c in calls]
        results = [f.result() for f in futures]
    return results, time.perf_counter() - t0


def generate_many(url: str, prompts: list[list[int]], max_new_tokens: int, logprobs: int = 0,
                  timeout_s: float = 600.0) -> dict:
    """Send every prompt at once to `url`/generate; summary + per-request rows."""
    calls = [lambda p=p: post_json(url + "/generate", generate_body(p, max_new_tokens, logprobs), timeout_s)
             for p in prompts]
    results, wall = run_many(calls)
    return summarise(results, wall, [len(p) for p in prompts])


def summarise(results: list, wall: float, input_lens: list[int]) -> dict:
    rows, ok, out_tok = [], 0, 0
    for (status, body, dt), n_in in zip(results, input_lens):
        good = status == 200 and isinstance(body, dict)
        meta = body.get("meta_info", {}) if good else {}
        ok += good
        out_tok += meta.get("completion_tokens", 0) or 0
        rows.append({"status": status, "e2e_s": round(dt, 4), "input_tokens": n_in,
                     "completion_tokens": meta.get("completion_tokens"),
                     "error": None if good else str(body)[:300], "body": body if good else None})
    lat = sorted(r["e2e_s"] for r in rows)
    return {"n": len(rows), "ok": ok, "wall_s": round(wall, 4), "completion_tokens": out_tok,
            "input_tokens": sum(input_lens), "latency_s_median": lat[len(lat) // 2] if lat else None,
            "latency_s_max": lat[-1] if lat else None, "rows": rows}
