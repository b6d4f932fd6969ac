"""Single-server calibration of one model on the GPU it runs on.

A plan is a list of server starts ("variants"); each start records its start-up phases (log + SGLang's
own timings), what SGLang derived (/server_info), and then runs the measurements named in the variant:
  prefill   one request of L tokens (max_new_tokens=1), and k requests of L tokens at once: latency
  decode    B requests of C tokens, then 100 greedy steps: step time from SGLang's `Decode batch` lines
            (a variant's decode_contexts: each batch at each of those C, a batch x context grid)
  context   the same at a fixed B over several context lengths
            (a variant's `repeats`: each decode/context point that many times in a row, rows tagged `repeat`;
            its `flush_cache`: POST /flush_cache before each decode/context point, so no point's prompts hit the
            radix cache an earlier point filled; the answer is the row's `cache_flushed`)
  beyond    decode at batch sizes around and past the largest captured CUDA graph
Results go to OUT/calibration-<name>.json after every step, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import time
from typing import Any
from pathlib import Path

from . import logparse
from .client import generate_many, random_ids
from .server import BASE_FLAGS, ServerDied, SglangServer, derived_limits

SCHEMA = "pdo-calibration-raw/1"

PREFILL_LENGTHS = [16, 256, 1024, 2048, 4096, 8192, 16000]
PREFILL_CONCURRENT = [(4, 1024), (8, 1024), (16, 1024), (8, 4096)]   # (k requests, L tokens each)
DECODE_BATCHES = [1, 8, 32, 64, 128, 192, 256, 384, 512]
DECODE_CONTEXT = 256
CONTEXT_BATCH, CONTEXT_LENGTHS = 16, [256, 2048, 8192, 15000]
BEYOND_BATCHES = [256, 320, 384, 512, 768, 1024]
DECODE_STEPS = 100


def default_plan(knob_mem_fraction: str = "0.70") -> list[dict]:
    return [
        {"name": "cold-default", "cache_state": "cold", "clear_caches": True, "flags": [],
         "measure": ["prefill", "context", "decode"]},   # large batches last: they can end the server
        {"name": "warm-default", "cache_state": "warm", "flags": [], "measure": []},
        {"name": "knobs", "cache_state": "warm",
         "flags": ["--mem-fraction-static", knob_mem_fraction, "--max-running-requests", "1024",
                   "--cuda-graph-max-bs-decode", "512"],
         "measure": ["beyond"]},
    ]


def gpu_info() -> dict:
    if not shutil.which("nvidia-smi"):
        return {"name": None}
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,memory.used,driver_version",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True)
    first = (q.stdout.strip().splitlines() or [""])[0].split(", ")
    if len(first) < 4:
        return {"name": None, "raw": q.stdout[-300:]}
    return {"name": first[0], "memory_total_mib": int(first[1]), "memory_used_mib_at_start": int(first[2]),
            "driver": first[3]}


def gpu_memory_used_mib() -> int | None:
    if not shutil.which("nvidia-smi"):
        return None
    q = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    try:
        return int(q.stdout.split()[0])
    except (IndexError, ValueError):
        return None


def cache_dirs() -> list[Path]:
    """Compile caches a fresh machine starts without: Triton, FlashInfer/DeepGEMM (~/.cache), Inductor."""
    home = Path.home()
    return [home / ".triton", home / ".cache", Path(f"/tmp/torchinductor_{os.environ.get('USER', 'root')}")]


def cache_sizes() -> dict[str, int]:
    out = {}
    for d in cache_dirs():
        total = 0
        for root, _, files in os.walk(d):
            for f in files:
                try:
                    total += os.path.getsize(os.path.join(root, f))
                except OSError:
                    pass
        out[str(d)] = total
    return out


def wipe_caches() -> bool:
    """Delete the compile caches (a cold start on a machine that already ran SGLang). Only where the
    environment says PDO_CALIB_ALLOW_CACHE_WIPE=1 (the GPU machine's script sets it), never by default."""
    if os.environ.get("PDO_CALIB_ALLOW_CACHE_WIPE") != "1":
        return False
    for d in cache_dirs():
        shutil.rmtree(d, ignore_errors=True)
    return True


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def _strip(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "rows"} | {
        "errors": [r["error"] for r in summary["rows"] if r["error"]][:3]}


def measure_prefill(server: SglangServer, rng: random.Random, vocab: int, budget: Budget, reps: int = 3,
                    lengths=None, concurrent=None, max_len: int | None = None) -> list[dict]:
    rows = []
    points = [(1, L) for L in (lengths or PREFILL_LENGTHS)] + list(concurrent or PREFILL_CONCURRENT)
    for k, L in points:
        if max_len and L > max_len:
            continue
        if budget.left() < 20:
            rows.append({"input_tokens": L, "concurrency": k, "skipped": "time budget"})
            break
        lat, errs = [], []
        for _ in range(reps + 1):   # the first one pays any per-shape JIT; reported, not in the median
            s = generate_many(server.url, [random_ids(rng, L, vocab) for _ in range(k)], 1)
            lat.append(s["latency_s_max"])
            errs += [r["error"] for r in s["rows"] if r["error"]]
        rows.append({"input_tokens": L, "concurrency": k, "batch_tokens": k * L, "latency_s_all": lat,
                     "latency_s_median": statistics.median(lat[1:]) if lat[1:] else None, "errors": errs[:2]})
        print(f"  prefill k={k} L={L}: median {rows[-1]['latency_s_median']}s (all {lat})", flush=True)
    return rows


def measure_decode_point(server: SglangServer, rng: random.Random, vocab: int, batch: int, context: int,
                         steps: int = DECODE_STEPS, max_running: int | None = None, flush: bool = False) -> dict:
    flushed = server.flush_cache() if flush else None
    offset = server.log_size()
    s = generate_many(server.url, [random_ids(rng, context, vocab) for _ in range(batch)], steps)
    text = server.log_since(offset)
    running = min(batch, max_running) if max_running else batch   # SGLang caps the running batch
    lines = logparse.decode_lines(text)
    step = logparse.decode_step(lines, running)
    prefills = logparse.prefill_lines(text)
    t0 = lines[0]["t"] if lines else 0.0
    row = {"batch_size": batch, "running_batch": running, "context_tokens": context, "decode_steps": steps, **step,
           "client": _strip(s), "prefill_batches": len(prefills), **({"cache_flushed": flushed} if flush else {}),
           "prefill_tokens_logged": sum(p["new_tokens"] for p in prefills),
           # the raw `Decode batch` lines of this point (s from the first), so any step rule can be re-derived
           "decode_lines": [[round(r["t"] - t0), r["ranks"], r["running"], r["tokens"], r["gen_tok_s"]] for r in lines]}
    print(f"  decode B={batch} C={context}: step {step.get('step_ms_median')} ms, graph {step.get('cuda_graph')}, "
          f"ok {s['ok']}/{s['n']}, wall {s['wall_s']}s", flush=True)
    return row


def measure_decode(server, rng, vocab, budget, batches, context, min_left=25.0, max_running=None,
                   repeats: int = 1, flush: bool = False) -> list[dict]:
    """Each batch `repeats` times in a row (fresh prompts of the same shape): `repeat` 0 is the point's first use of
    its shapes, 1 and on the same point again, so a first-use stall shows as the difference between the two."""
    rows = []
    for b in batches:
        for rep in range(repeats):
            if budget.left() < min_left:
                rows.append({"batch_size": b, "context_tokens": context, "repeat": rep, "skipped": "time budget"})
                continue
            rows.append(measure_decode_point(server, rng, vocab, b, context, max_running=max_running, flush=flush)
                        | {"repeat": rep})
            if not server.alive():
                rows[-1]["server_died"] = True
                return rows
    return rows


def measure_context(server, rng, vocab, budget, max_context: int, lengths=None, repeats: int = 1,
                    flush: bool = False) -> list[dict]:
    rows = []
    for c in lengths or CONTEXT_LENGTHS:
        if c + DECODE_STEPS + 8 > max_context:
            continue
        for rep in range(repeats):
            if budget.left() < 30:
                rows.append({"batch_size": CONTEXT_BATCH, "context_tokens": c, "repeat": rep, "skipped": "time budget"})
                continue
            rows.append(measure_decode_point(server, rng, vocab, CONTEXT_BATCH, c, flush=flush) | {"repeat": rep})
            if not server.alive():
                return rows
    return rows


def describe_plan(plan: list[dict], common_flags: list[str], context_length: int = 16384) -> str:
    """What `run_single` would start and measure, one line per server, without starting anything."""
    common = ["--context-length", str(context_length), *common_flags]
    points = {"prefill": lambda v: f"prefill L {v.get('prefill_lengths') or PREFILL_LENGTHS}",
              "decode": lambda v: f"decode B {v.get('decode_batches') or DECODE_BATCHES} "
                                  + (f"x C {v['decode_contexts']}" if v.get("decode_contexts") else f"C={DECODE_CONTEXT}"),
              "context": lambda v: f"context B={CONTEXT_BATCH} C {v.get('context_lengths') or CONTEXT_LENGTHS}",
              "beyond": lambda v: f"beyond B {BEYOND_BATCHES} C={DECODE_CONTEXT}"}
    lines = []
    for v in plan:
        measured = "; ".join(points[m](v) for m in v.get("measure", []) if m in points) or "start-up only"
        if int(v.get("repeats", 1)) > 1:
            measured += f"; each decode/context point {v['repeats']} times in a row (warm repeat)"
        if v.get("flush_cache"):
            measured += "; radix cache flushed before each decode/context point"
        lines.append(f"server {v['name']} ({v.get('cache_state')}): sglang.launch_server {' '.join(BASE_FLAGS)} "
                     f"{' '.join(common + v['flags'])}; measure {measured}; skipped with < {v.get('min_left_s', 90)} s left")
    return "\n".join(lines)


def run_single(model_path: str, name: str, out_dir: Path, budget_s: float, port: int = 30000,
               plan: list[dict] | None = None, context_length: int = 16384, common_flags: list[str] | None = None,
               env: dict | None = None, ready_timeout_s: float = 420.0, seed: int = 2025) -> dict:
    budget = Budget(budget_s)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    vocab = int(cfg["vocab_size"])
    rng = random.Random(seed)
    result: dict[str, Any] = {"schema": SCHEMA, "kind": "single-server", "name": name, "gpu": gpu_info(),
              "model": {"path": str(model_path), "config": cfg}, "common_flags": None, "runs": []}
    common = ["--context-length", str(context_length), *(common_flags or [])]
    result["common_flags"] = common
    path = out_dir / f"calibration-{name}.json"

    def save():
        path.write_text(json.dumps(result, indent=1))

    for variant in plan or default_plan():
        run = {"variant": variant["name"], "cache_state": variant.get("cache_state"), "flags": variant["flags"],
               "measure": variant.get("measure", [])}
        result["runs"].append(run)
        if budget.left() < variant.get("min_left_s", 90):
            run["skipped"] = f"time budget ({budget.left():.0f}s left)"
            save()
            continue
        if variant.get("clear_caches"):
            run["caches_wiped"] = wipe_caches()
        run["cache_bytes_at_start"] = cache_sizes()
        log = out_dir / f"server-{name}-{variant['name']}.log"
        srv = SglangServer(f"{name}/{variant['name']}", model_path, port, log, common + variant["flags"], env=env)
        print(f"[{name}] start {variant['name']} ({budget.left():.0f}s left): {' '.join(srv.argv[3:])}", flush=True)
        try:
            srv.start()
            run["ready_after_s"] = srv.wait_ready(min(ready_timeout_s, budget.left() - 10))
            print(f"[{name}] {variant['name']} ready after {run['ready_after_s']}s", flush=True)
            run["gpu_memory_used_mib_ready"] = gpu_memory_used_mib()
            info = srv.get_json("/server_info")
            run["derived"] = derived_limits(info)
            result["sglang_version"] = run["derived"].get("version")
            run["startup"] = logparse.startup(srv.log_text(), srv.launched_at)
            save()
            max_ctx = int(info.get("context_length") or context_length)
            cap = run["derived"].get("effective_max_running_requests_per_dp")
            repeats = int(variant.get("repeats", 1))   # decode and context points only
            flush = bool(variant.get("flush_cache"))
            for m in variant.get("measure", []):
                # a variant may name its own points (prefill_lengths, prefill_concurrent, decode_batches,
                # context_lengths); the defaults above otherwise
                if m == "prefill":
                    run["prefill"] = measure_prefill(srv, rng, vocab, budget, max_len=max_ctx - 8,
                                                     lengths=variant.get("prefill_lengths"),
                                                     concurrent=[tuple(kl) for kl in variant.get("prefill_concurrent") or []])
                elif m == "decode":   # decode_contexts: the batches at each context per request (a grid)
                    rows = run["decode"] = []
                    for c in variant.get("decode_contexts") or [DECODE_CONTEXT]:
                        rows += measure_decode(srv, rng, vocab, budget, variant.get("decode_batches") or DECODE_BATCHES,
                                               c, max_running=cap, repeats=repeats, flush=flush)
                        save()
                        if not srv.alive():
                            break
                elif m == "context":
                    run["context"] = measure_context(srv, rng, vocab, budget, max_ctx, variant.get("context_lengths"),
                                                     repeats=repeats, flush=flush)
                elif m == "beyond":
                    run["beyond"] = measure_decode(srv, rng, vocab, budget, BEYOND_BATCHES, DECODE_CONTEXT,
                                                   max_running=cap)
                save()
                if not srv.alive():
                    run["server_died"] = True
                    break
        except (ServerDied, TimeoutError, OSError, ValueError) as exc:
            run["error"] = f"{type(exc).__name__}: {str(exc)[-1500:]}"
            print(f"[{name}] {variant['name']}: {run['error'][:400]}", flush=True)
        finally:
            if "startup" not in run:
                run["startup"] = logparse.startup(srv.log_text(), srv.launched_at)
            tail = srv.log_text()
            run["oom_in_log"] = "out of memory" in tail.lower()
            srv.stop()
            run["gpu_memory_used_mib_after_stop"] = gpu_memory_used_mib()
            save()
    return result
