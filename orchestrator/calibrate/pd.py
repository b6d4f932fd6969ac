"""PD on one GPU: a prefill and a decode SGLang server sharing the GPU, KV moved by NIXL (UCX).

For each page size: start the pair (each with a fixed KV pool, `--max-total-tokens`, so the two fit beside
each other; the decode starts once the prefill has allocated its memory, so its imports overlap the
prefill's kernel compiles), then run loads of distinct prompts (own token ids per load: no prefix-cache
hits) under each sender mode of `nixl_patch` (flags switched per load through files, one server pair):
  base            SGLang 0.5.17 as shipped (prepped descriptor lists; queue chosen by decode port)
  coalesce        merged descriptors (one per run of consecutive slots per layer)
  shard           queue chosen by room (every transfer worker busy, not one)
  coalesce+shard  both
  poll            the prefill scheduler polls its in-flight transfers while it waits for a batch (not once per batch)
  shard+poll      both
  early           the prefill takes the KV page indices from a host copy made before the next batch's WAR
                  barrier (`early_kv`), not from `.cpu()` behind the next forward
Reps alternate the order of modes (forward, then backward). Per load: wall time and throughput, SGLang's
`sglang:kv_transfer_*` histograms (delta of the prefill's /metrics) and the per-request timelines of
`kvtimeline` (KV ready on the prefill -> decode sees it, and its parts). Then top-k logprobs of the first
decode steps for fixed prompts under every mode (and optionally one aggregated server), compared.
The client plays SGLang's PD router: the same body with bootstrap_host/port/room goes to both servers.
What a load's metrics, sender lines and logprobs are read as: pd_readout.py.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any
from pathlib import Path

from . import early_kv, kvtimeline, logparse, nixl_patch
from .client import generate_body, post_json, random_ids, run_many, summarise
from .pd_readout import by_mode, chunk_stats, compare_logprobs, cross_prompt_control, kv_delta, prom_sums, top_logprobs
from .server import ServerDied, SglangServer, derived_limits
from .single import SCHEMA, Budget, gpu_info, gpu_memory_used_mib

MODES = {"base": (), "coalesce": ("COALESCE",), "shard": ("SHARD_BY_ROOM",),
         "coalesce+shard": ("COALESCE", "SHARD_BY_ROOM"), "poll": ("PREFILL_POLL",),
         "shard+poll": ("SHARD_BY_ROOM", "PREFILL_POLL"), "early": ("EARLY_KV_INDICES",)}
FLAGS = ("COALESCE", "SHARD_BY_ROOM", "PREFILL_POLL", "EARLY_KV_INDICES")   # EARLY_KV_INDICES: early_kv.py


def pd_generate_many(prefill: SglangServer, decode: SglangServer, bootstrap_port: int, prompts, max_new: int,
                     rng: random.Random, logprobs: int = 0) -> dict:
    def one(p):
        room = rng.randrange(0, 2 ** 63)
        body = generate_body(p, max_new, logprobs, bootstrap_host="127.0.0.1", bootstrap_port=bootstrap_port,
                             bootstrap_room=room)
        res, _ = run_many([lambda: post_json(prefill.url + "/generate", body),
                           lambda: post_json(decode.url + "/generate", body)], workers=2)
        (ps, pb, _), (ds, db, dt) = res
        if ps != 200 and ds == 200:
            return ps, f"prefill: {str(pb)[:200]}", dt
        return ds, db, dt
    results, wall = run_many([lambda p=p: one(p) for p in prompts])
    return summarise(results, wall, [len(p) for p in prompts])


def run_pd(model_path: str, out_dir: Path, budget_s: float, page_sizes=(1,), prefill_frac: float = 0.50,
           decode_frac: float = 0.95, kv_tokens: int = 160000, n_requests: int = 96, len_range=(256, 2048),
           max_new: int = 32, loads_per_mode: int = 2, logprob_prompts: int = 16, logprob_steps: int = 8,
           topk: int = 5, context_length: int = 16384, agg_frac: float = 0.80, seed: int = 2025,
           ports=(30000, 30001, 30002), bootstrap_port: int = 8998, extra_env: dict | None = None,
           with_agg: bool = True, prefill_gpu: int | None = None, decode_gpu: int | None = None,
           extra_flags: list[str] | None = None, modes=("base", "coalesce", "shard", "coalesce+shard"),
           prefill_flags: list[str] | None = None) -> dict:
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"pd modes: unknown {unknown}; choose from {sorted(MODES)}")
    budget = Budget(budget_s)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    vocab = int(cfg["vocab_size"])
    env = {"SGLANG_HOST_IP": "127.0.0.1", **{f"PDO_NIXL_{f}_FILE": str(_flag_path(out_dir, f)) for f in FLAGS},
           **(extra_env or {})}
    _set_mode(out_dir, "base")
    result: dict[str, Any] = {"schema": SCHEMA, "kind": "pd-one-gpu", "gpu": gpu_info(), "model": {"path": model_path, "config": cfg},
              "settings": {"prefill_frac": prefill_frac, "decode_frac": decode_frac, "kv_tokens": kv_tokens,
                           "n_requests": n_requests, "len_range": list(len_range), "max_new": max_new,
                           "logprob_prompts": logprob_prompts, "logprob_steps": logprob_steps, "topk": topk,
                           "prefill_gpu": prefill_gpu, "decode_gpu": decode_gpu, "extra_flags": extra_flags,
                           "modes": list(modes), "loads_per_mode": loads_per_mode,
                           "prefill_flags": prefill_flags},
              "pages": [], "logprobs": {}}
    path = out_dir / "calibration-pd.json"

    def save():
        path.write_text(json.dumps(result, indent=1))

    lp_rng = random.Random(seed + 1)
    lp_prompts = [random_ids(lp_rng, lp_rng.randrange(64, 512), vocab) for _ in range(logprob_prompts)]
    pd_lp: dict[str, list] = {}
    common = ["--context-length", str(context_length), "--max-total-tokens", str(kv_tokens),
              "--disaggregation-transfer-backend", "nixl", *(extra_flags or [])]
    agg_lp = None
    for i_ps, ps in enumerate(list(page_sizes) + [None]):
        if ps is None or i_ps == 1:
            if with_agg and agg_lp is None and "agg_ready_after_s" not in result and "agg_error" not in result:
                agg_lp = _agg_reference(model_path, out_dir, ports[2], context_length, agg_frac, env, budget,
                                        lp_prompts, logprob_steps, topk, result, extra_flags or [])
            if ps is None:
                break
        entry: dict[str, Any] = {"page_size": ps, "loads": []}
        result["pages"].append(entry)
        if budget.left() < 150:
            entry["skipped"] = f"time budget ({budget.left():.0f}s left)"
            save()
            continue
        pf = SglangServer(f"prefill-p{ps}", model_path, ports[0], out_dir / f"pd-prefill-page{ps}.log",
                          common + ["--page-size", str(ps), "--disaggregation-mode", "prefill",
                                    "--disaggregation-bootstrap-port", str(bootstrap_port),
                                    "--mem-fraction-static", str(prefill_frac), *_gpu_flag(prefill_gpu),
                                    *(prefill_flags or [])],
                          env={**env, "UCX_PROTO_INFO": "y"} if ps == page_sizes[0] else env)
        dc = SglangServer(f"decode-p{ps}", model_path, ports[1], out_dir / f"pd-decode-page{ps}.log",
                          common + ["--page-size", str(ps), "--disaggregation-mode", "decode",
                                    "--mem-fraction-static", str(decode_frac), "--cuda-graph-max-bs-decode", "128",
                                    *_gpu_flag(decode_gpu)],
                          env=env)
        try:
            _start_pair(pf, dc, budget, entry)
            patched = _patches_installed()
            entry["nixl_patch_installed"] = patched
            page_modes = list(modes) if patched else ["base"]
            rng = random.Random(seed)
            warm = [random_ids(rng, 128, vocab) for _ in range(8)]
            pd_generate_many(pf, dc, bootstrap_port, warm, 4, rng)  # first-shape JIT out of the loads
            wrng = random.Random(f"warm-{seed}")   # and one load of the measured shape, not recorded
            warm = [random_ids(wrng, wrng.randrange(*len_range), vocab) for _ in range(n_requests)]
            w = pd_generate_many(pf, dc, bootstrap_port, warm, max_new, rng)
            entry["warm_load"] = {"ok": w["ok"], "n": w["n"], "wall_s": w["wall_s"]}
            print(f"  warm load: ok {w['ok']}/{w['n']} wall {w['wall_s']:.2f}s", flush=True)
            for rep in range(loads_per_mode):
                for mode in (page_modes if rep % 2 == 0 else page_modes[::-1]):
                    if budget.left() < 45:
                        entry["loads"].append({"mode": mode, "rep": rep, "skipped": "time budget"})
                        continue
                    load = _one_load(pf, dc, bootstrap_port, out_dir, mode, rep, seed, n_requests, len_range,
                                     max_new, vocab, rng)
                    entry["loads"].append(load)
                    save()
            for mode in page_modes:
                if budget.left() < 30:
                    break
                _set_mode(out_dir, mode)
                # a cold prefix cache: every mode computes and moves the prompts' whole KV itself
                result["logprobs"][f"pd-page{ps}-{mode}-flushed"] = [srv.flush_cache() for srv in (pf, dc)]
                s = pd_generate_many(pf, dc, bootstrap_port, lp_prompts, logprob_steps, rng, logprobs=topk)
                pd_lp[f"pd-page{ps}-{mode}"] = top_logprobs(s)
                result["logprobs"][f"pd-page{ps}-{mode}-ok"] = s["ok"]
            entry["by_mode"] = by_mode(entry["loads"])
        except (ServerDied, TimeoutError, OSError, ValueError) as exc:
            entry["error"] = f"{type(exc).__name__}: {str(exc)[-1500:]}"
            print(f"  page {ps}: {entry['error'][:600]}", flush=True)
        finally:
            _set_mode(out_dir, "base")
            for srv in (dc, pf):
                srv.stop()
            entry["oom_in_logs"] = any("out of memory" in s.log_text().lower() for s in (pf, dc))
            save()
    result["logprobs"]["raw"] = {**pd_lp, **({"agg": agg_lp} if agg_lp else {})}
    cmp = {}
    names = list(pd_lp)
    if agg_lp:
        cmp["control_agg_cross_prompt"] = cross_prompt_control(agg_lp, logprob_steps)
        for n in names:
            cmp[f"{n}_vs_agg"] = compare_logprobs(pd_lp[n], agg_lp, logprob_steps)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            cmp[f"{a}_vs_{b}"] = compare_logprobs(pd_lp[a], pd_lp[b], logprob_steps)
        cmp[f"control_{a}_cross_prompt"] = cross_prompt_control(pd_lp[a], logprob_steps)
    result["logprobs"]["compare"] = cmp
    save()
    return result


def _start_pair(pf: SglangServer, dc: SglangServer, budget: Budget, entry: dict) -> None:
    """Prefill first; the decode once the prefill's memory is allocated (its imports then overlap the
    prefill's warm-up compiles, and it measures free memory after the prefill took its share)."""
    pf.start()
    entry["prefill_memory_ready_after_s"] = pf.wait_log("Memory pool end", min(300, budget.left() - 90))
    dc.start()
    entry["prefill_ready_after_s"] = pf.wait_ready(min(360, budget.left() - 45))
    entry["gpu_memory_used_mib_prefill_ready"] = gpu_memory_used_mib()
    entry["decode_ready_after_s"] = dc.wait_ready(min(360, budget.left() - 30))
    entry["gpu_memory_used_mib_both_ready"] = gpu_memory_used_mib()
    entry["prefill_derived"] = derived_limits(pf.get_json("/server_info"))
    entry["decode_derived"] = derived_limits(dc.get_json("/server_info"))
    entry["prefill_startup"] = logparse.startup(pf.log_text(), pf.launched_at)
    entry["decode_startup"] = logparse.startup(dc.log_text(), dc.launched_at)
    print(f"  pair ready: prefill {entry['prefill_ready_after_s']}s (memory {entry['prefill_memory_ready_after_s']}s),"
          f" decode {entry['decode_ready_after_s']}s after its start", flush=True)


def _one_load(pf, dc, bootstrap_port, out_dir, mode, rep, seed, n_requests, len_range, max_new, vocab, rng) -> dict:
    _set_mode(out_dir, mode)
    lrng = random.Random(seed + 100 + rep)   # same prompt lengths for every mode of a rep,
    lengths = [lrng.randrange(*len_range) for _ in range(n_requests)]
    irng = random.Random(f"ids-{seed}-{rep}-{mode}")   # other ids: no prefix-cache hits
    prompts = [random_ids(irng, n, vocab) for n in lengths]
    before, off, doff = prom_sums(pf.get_text("/metrics")), pf.log_size(), dc.log_size()
    s = pd_generate_many(pf, dc, bootstrap_port, prompts, max_new, rng)
    after = prom_sums(pf.get_text("/metrics"))
    text, dtext = pf.log_since(off), dc.log_since(doff)
    pre = logparse.prefill_lines(text)
    tl = kvtimeline.summary(kvtimeline.requests(text, dtext))
    load = {"mode": mode, "rep": rep, "n": s["n"], "ok": s["ok"], "wall_s": s["wall_s"],
            "input_tokens": s["input_tokens"], "completion_tokens": s["completion_tokens"],
            "output_tok_s": round(s["completion_tokens"] / s["wall_s"], 1) if s["wall_s"] else None,
            "total_tok_s": round((s["input_tokens"] + s["completion_tokens"]) / s["wall_s"], 1) if s["wall_s"] else None,
            "latency_s_median": s["latency_s_median"], "latency_s_max": s["latency_s_max"],
            "errors": [r["error"] for r in s["rows"] if r["error"]][:3],
            "sglang_kv": kv_delta(before, after), "worker": chunk_stats(text), "timeline": tl,
            "prefill_loop": kvtimeline.iterations(text),
            "prefill_new_tokens": sum(r["new_tokens"] for r in pre),
            "prefill_cached_tokens": sum(r["cached_tokens"] for r in pre)}
    k = load["sglang_kv"]
    print(f"  {mode:>14} rep {rep}: ok {s['ok']}/{s['n']} wall {s['wall_s']:.2f}s; KV computed->decode-seen p50/p90 "
          f"{tl['computed_to_seen']['p50']}/{tl['computed_to_seen']['p90']} ms (send delay {tl['send_delay']['p50']}); "
          f"enqueued->decode-seen p50/p90 "
          f"{tl['ready_to_seen']['p50']}/{tl['ready_to_seen']['p90']} ms (queue {tl['queue']['p50']}/{tl['queue']['p90']},"
          f" worker {tl['worker']['p50']}/{tl['worker']['p90']}, decode notice {tl['decode_notice']['p50']}); sglang "
          f"latency mean {k['kv_transfer_latency_ms_mean']} ms; queues {tl['queues_used']}; descs/req "
          f"{tl['descs_per_request_mean']}; prefill new/cached {load['prefill_new_tokens']}/{load['prefill_cached_tokens']};"
          f" prefill loop {load['prefill_loop']}",
          flush=True)
    return load


def _agg_reference(model_path, out_dir, port, context_length, agg_frac, env, budget, prompts, steps, topk,
                   result, extra_flags: list[str]) -> list | None:
    """Aggregated server on the same GPU, same dummy weights (SGLang seeds them per parameter)."""
    if budget.left() < 90:
        result["agg_error"] = f"skipped: time budget ({budget.left():.0f}s left)"
        return None
    agg = SglangServer("aggregated", model_path, port, out_dir / "agg.log",
                       ["--context-length", str(context_length), "--mem-fraction-static", str(agg_frac),
                        "--cuda-graph-max-bs-decode", "128", *extra_flags], env=env)
    try:
        agg.start()
        result["agg_ready_after_s"] = agg.wait_ready(min(300, budget.left() - 20))
        s = _agg_many(agg, prompts, steps, topk)
        result["logprobs"]["agg-ok"] = s["ok"]
        return top_logprobs(s)
    except (ServerDied, TimeoutError, OSError, ValueError) as exc:
        result["agg_error"] = f"{type(exc).__name__}: {str(exc)[-800:]}"
        return None
    finally:
        agg.stop()


def _agg_many(agg: SglangServer, prompts, steps: int, topk: int) -> dict:
    calls = [lambda p=p: post_json(agg.url + "/generate", generate_body(p, steps, topk)) for p in prompts]
    results, wall = run_many(calls)
    return summarise(results, wall, [len(p) for p in prompts])


def _gpu_flag(gpu: int | None) -> list[str]:
    # every GPU stays visible to both servers (cuda_ipc needs it); --base-gpu-id picks the one each uses
    return [] if gpu is None else ["--base-gpu-id", str(gpu)]


def _flag_path(out_dir: Path, flag: str) -> Path:
    return out_dir / f"flag-{flag}.on"


def _set_mode(out_dir: Path, mode: str) -> None:
    """Create the flag files the mode needs and remove the others (the patched sender reads them per transfer)."""
    for flag in FLAGS:
        if flag in MODES[mode]:
            _flag_path(out_dir, flag).write_text("on\n")
        else:
            _flag_path(out_dir, flag).unlink(missing_ok=True)


def _patches_installed() -> bool:
    """Every file `calibrate nixl-patch` patches carries its patch's mark in the sglang on PYTHONPATH."""
    return all(mark in _installed_source(target) for target, _, _, mark in nixl_patch.PLANS + early_kv.PLANS)


def _installed_source(target: str) -> str:
    for base in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        p = Path(base) / target
        if p.is_file():
            return p.read_text()
    return ""
