"""Replay our benchmark batch against any SGLang-compatible /generate (SGLang's own PD router, one server).

Used on the GPU machine for the comparisons our Ray path does not run itself: (b) `sglang_router` in front
of the PD pair, and the greedy PD-vs-aggregated output check. The batch is exactly `bench`'s (same
sampler, tokenizer, seed), sent as input_ids with bench_serving's sampling params (greedy, ignore_eos).
  dump    --config C --out batch.json [--set K=V ...]     sample once, here or there
  run     --batch batch.json --url URL --out r.json [--concurrency N] [--limit K] [--max-new-tokens T] [--stream]
          (--stream: `stream: true`, each record also holds its send and first-chunk times from the run's start)
  compare a.json b.json                                   greedy output ids equal, prompt by prompt
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def cmd_dump(args: argparse.Namespace) -> int:
    from orchestrator.config import load_config
    from orchestrator.run.bench import max_in_flight
    from orchestrator.workload.batch import sample_batch, warmup_batch

    cfg = load_config(args.config, args.overrides)
    reqs = sample_batch(cfg, cfg.benchmark.num_prompts)
    rows: list[dict[str, Any]] = [
        {"index": r.index, "input_ids": list(r.input_ids), "output_len": r.output_len} for r in reqs]
    warm = [{"index": r.index, "input_ids": list(r.input_ids), "output_len": r.output_len}
            for r in warmup_batch(cfg, len(rows))]
    digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]
    data = {"config": args.config, "seed": cfg.benchmark.seed, "sha": digest,
            "max_in_flight": max_in_flight(cfg, len(rows)), "requests": rows, "warmup": warm}
    Path(args.out).write_text(json.dumps(data))
    n_in = sum(len(r["input_ids"]) for r in rows)
    n_out = sum(r["output_len"] for r in rows)
    print(f"{args.out}: {len(rows)} prompts, {n_in} input / {n_out} output tokens, sha {digest}, "
          f"max_in_flight {data['max_in_flight']}")
    return 0


async def _one_stream(client, url: str, body: dict, t_run: float) -> dict:
    """A streaming /generate read to its end: send and first-chunk times from the run's start, the last chunk's
    output ids and meta_info."""
    t0 = time.perf_counter()
    first, last = None, {}
    async with client.stream("POST", url + "/generate", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            return {"ok": False, "error": f"HTTP {r.status_code}", "e2e_s": time.perf_counter() - t0}
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            first = first if first is not None else time.perf_counter() - t_run
            last = json.loads(line[5:])
    meta = last.get("meta_info", {})
    return {"ok": True, "e2e_s": time.perf_counter() - t0, "sent_s": t0 - t_run, "first_s": first,
            "prompt_tokens": meta.get("prompt_tokens"), "completion_tokens": meta.get("completion_tokens"),
            "output_ids": last.get("output_ids")}


async def _one(client, url: str, row: dict, max_new: int | None, sem: asyncio.Semaphore,
               t_run: float | None = None) -> dict:
    body = {
        "input_ids": row["input_ids"],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new or row["output_len"],
                            "ignore_eos": True},
        "stream": False,
    }
    async with sem:
        t0 = time.perf_counter()
        if t_run is not None:
            try:
                return {"index": row["index"], **await _one_stream(client, url, body, t_run)}
            except Exception as exc:  # every prompt ends with a record, failures included
                return {"index": row["index"], "ok": False, "error": f"{type(exc).__name__}: {exc}",
                        "e2e_s": time.perf_counter() - t0}
        try:
            r = await client.post(url + "/generate", json=body)
            dt = time.perf_counter() - t0
            if r.status_code != 200:
                return {"index": row["index"], "ok": False, "error": f"HTTP {r.status_code}: {r.text[:200]}", "e2e_s": dt}
            out = r.json()
            meta = out.get("meta_info", {})
            return {"index": row["index"], "ok": True, "e2e_s": dt, "prompt_tokens": meta.get("prompt_tokens"),
                    "completion_tokens": meta.get("completion_tokens"), "output_ids": out.get("output_ids")}
        except Exception as exc:  # every prompt ends with a record, failures included
            return {"index": row["index"], "ok": False, "error": f"{type(exc).__name__}: {exc}",
                    "e2e_s": time.perf_counter() - t0}


async def _run(args: argparse.Namespace) -> dict:
    import httpx

    batch = json.loads(Path(args.batch).read_text())  # noqa: ASYNC240 (once, before any request is sent)
    rows = batch["warmup" if args.warmup else "requests"]
    rows = rows[: args.limit] if args.limit else rows
    conc = args.concurrency or batch.get("max_in_flight") or len(rows)
    sem = asyncio.Semaphore(conc)
    limits = httpx.Limits(max_connections=conc + 8, max_keepalive_connections=conc + 8)
    async with httpx.AsyncClient(timeout=args.timeout_s, limits=limits) as client:
        t_epoch = time.time()
        t0 = time.perf_counter()
        results = await asyncio.gather(*[_one(client, args.url, r, args.max_new_tokens, sem,
                                              t0 if args.stream else None) for r in rows])
        wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    ok_idx = {r["index"] for r in ok}
    n_in = sum(len(r["input_ids"]) for r in rows if r["index"] in ok_idx)
    n_out = sum(r.get("completion_tokens") or 0 for r in ok)
    lat = sorted(r["e2e_s"] for r in ok)
    summary = {
        "url": args.url, "batch_sha": batch.get("sha"), "num_prompts": len(rows), "completed": len(ok),
        "failed": len(rows) - len(ok), "concurrency": conc, "duration_s": wall,
        "input_tokens": n_in, "output_tokens": n_out,
        "request_throughput": len(ok) / wall, "input_tok_s": n_in / wall, "output_tok_s": n_out / wall,
        "total_tok_s": (n_in + n_out) / wall,
        "p50_e2e_s": lat[len(lat) // 2] if lat else None, "p99_e2e_s": lat[int(len(lat) * 0.99) - 1] if lat else None,
        "first_errors": [r["error"] for r in results if not r["ok"]][:5],
    }
    if args.stream:
        firsts = sorted(r["first_s"] for r in ok if r.get("first_s") is not None)
        sends = sorted(r["sent_s"] for r in ok)
        summary.update({"stream": True, "start_epoch_s": t_epoch,
                        "last_sent_s": sends[-1] if sends else None,
                        "first_token_s": firsts[:1] + [firsts[len(firsts) // 2], firsts[-1]] if firsts else None})
    return {"summary": summary, "results": results}


def cmd_run(args: argparse.Namespace) -> int:
    data = asyncio.run(_run(args))
    Path(args.out).write_text(json.dumps(data))
    s = data["summary"]
    print(f"{args.url}: {s['completed']}/{s['num_prompts']} ok in {s['duration_s']:.2f}s, "
          f"{s['request_throughput']:.2f} req/s, input {s['input_tok_s']:.0f} tok/s, output {s['output_tok_s']:.0f} tok/s, "
          f"total {s['total_tok_s']:.0f} tok/s (concurrency {s['concurrency']})")
    for e in s["first_errors"]:
        print("  error:", e)
    return 0 if s["completed"] == s["num_prompts"] else 1


def cmd_compare(args: argparse.Namespace) -> int:
    a = {r["index"]: r for r in json.loads(Path(args.a).read_text())["results"]}
    b = {r["index"]: r for r in json.loads(Path(args.b).read_text())["results"]}
    common = sorted(set(a) & set(b))
    same = [i for i in common if a[i]["ok"] and b[i]["ok"] and a[i]["output_ids"] == b[i]["output_ids"]]
    diff = [i for i in common if i not in same]
    verdict = {"compared": len(common), "identical": len(same), "different": diff}
    print(json.dumps(verdict))
    if args.out:
        Path(args.out).write_text(json.dumps(verdict))
    return 0 if common and not diff else 1


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--config", required=True)
    d.add_argument("--set", dest="overrides", action="append", default=[])
    d.add_argument("--out", required=True)
    d.set_defaults(func=cmd_dump)
    r = sub.add_parser("run")
    r.add_argument("--batch", required=True)
    r.add_argument("--url", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--concurrency", type=int, default=None, help="default: the batch's max_in_flight (as bench)")
    r.add_argument("--limit", type=int, default=None, help="only the first K prompts")
    r.add_argument("--max-new-tokens", type=int, default=None, help="fixed greedy length instead of the batch's")
    r.add_argument("--timeout-s", type=float, default=600)
    r.add_argument("--warmup", action="store_true", help="send the batch's warm-up prompts (as bench does first)")
    r.add_argument("--stream", action="store_true", help="stream each answer; record send and first-chunk times")
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--out", default=None)
    c.set_defaults(func=cmd_compare)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
