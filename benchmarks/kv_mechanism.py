"""The KV hand-off of SGLang 0.5.17 PD by its mechanism: the transfer worker's constants fitted from the PDO_NIXL lines,
and the per-request parts the model gives a PD pair (server/kv_transfer.py + the simulation's queue and polls).

    .venv/bin/python benchmarks/kv_mechanism.py fit
    .venv/bin/python benchmarks/kv_mechanism.py predict --model models/qwen3-235b-a22b-fp8-l6 --gpu H200 \
        [--quantization fp8] [--layers 6,12] [--page-sizes 1,16,64] [--prompt 4000 | --prompt-range 256,2048] \
        [--concurrency 16] [--tp 1] \
        [--chunk 8192] [--mem-fraction 0.85]
    .venv/bin/python benchmarks/kv_mechanism.py check

fit: every `PDO_NIXL` chunk line (orchestrator/calibrate/kvtimeline.chunks) of the prefill log of
benchmarks/results/2026-11-24-kv-transfer-h100-s5 call 2 (V2-Lite shape, 27 layers, page 1; prefill on one H200,
decode on another of the same host, NVLink; transfer queue by destination, SGLang's own) in both its sender modes:
SGLang's prepped path (one descriptor per slot per layer) and the coalesced one (one per run of slots, ~1,000x
fewer). Least squares of a chunk's post + wait on [1, descriptors, MB]: the intercept is gpus.GpuSpec.kv_chunk_s,
the MB slope the KV path's NVLink rate (kv_transfer.KV_NVLINK_SHARE of 450 GB/s), the descriptor slope
kv_transfer.KV_DESCRIPTOR_S (0 where it is not positive). The same fit on call 1 (both servers on one H100) is
printed beside it: there the worker waits for the GPU the prefill keeps busy, which the constants do not describe.

predict: for a PD pair of one prefill and one decode server of the given shape on two GPUs of one host (NVLink), a
load of `concurrency` requests of `prompt` tokens sent at once (the calibrate pd harness's load), per page size:
descriptors per request per rank, the worker's time (chunks x kv_chunk_s + descriptors x KV_DESCRIPTOR_S + bytes
at the NVLink KV rate), and the parts a request's KV waits on its way (ms, p50 / p90 over the load's requests):
  queue          behind the requests of its prefill batch on the one worker (one decode server: one queue): the
                 k-th request of a batch of b = min(concurrency, chunk // prompt) waits k worker times
  decode notice  the decode's next scheduler turn: uniform over one decode step at batch `concurrency`
  enqueued -> decode sees  queue + worker + decode notice (each request's sum, then its p50 / p90)
  send delay     the overlap loop sends a batch's KV after the next prefill forward (that forward's modelled time)
Approximations: the batch's requests enqueue at one instant; the queue is empty when a batch's KV arrives (printed:
the worker's busy time per batch vs the prefill forward); the decode notice is independent of the rest.

check: `predict` for call 2's own load (V2-Lite, H200, page 1, 96 requests of U[256, 2048) tokens, i.e. its
prompts' median 1,130) against call 2's per-request parts (in-sample: the constants come from its chunks).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.calibrate.kvtimeline import chunks, requests, summary  # noqa: E402
from orchestrator.config.model_presets import DEEPSEEK_V2_LITE, ModelArchitecture  # noqa: E402
from orchestrator.perfmodel.costmodel import EngineCostModel, build_cost_model  # noqa: E402

S5 = ROOT / "benchmarks" / "results" / "2026-11-24-kv-transfer-h100-s5"
CALLS = {"call2 (2 x H200, NVLink)": "logs-pd-call2-h200x2.tar.xz", "call1 (1 x H100, both servers)": "logs-pd-call1.tar.xz"}


def _logs(name: str) -> tuple[str, str]:
    """(prefill log, decode log) of a call's page-1 pair."""
    with tarfile.open(S5 / name) as tar:
        texts = {}
        for member in tar.getmembers():
            f = tar.extractfile(member) if member.name.endswith(".log") else None
            if f is not None:
                texts[member.name] = f.read().decode()
    pre = next(t for n, t in texts.items() if "prefill" in n)
    dec = next(t for n, t in texts.items() if "decode" in n)
    return pre, dec


def fit_chunks(prefill_log: str) -> dict:
    """Least squares of post + wait (ms) on [1, descriptors, MB] over the chunks sent on SGLang's own queue."""
    cs = [c for c in chunks(prefill_log) if c["shard"] == "dst"]
    d = np.array([c["descs"] for c in cs], float)
    mb = np.array([c["bytes"] for c in cs], float) / 1e6
    w = np.array([c["post_ms"] + c["wait_ms"] for c in cs])
    a = np.c_[np.ones_like(d), d, mb]
    coef = np.linalg.lstsq(a, w, rcond=None)[0]
    rel = np.abs(a @ coef - w) / w
    prepped = [c for c in cs if c["mode"] == "prepped"]
    dp = np.array([c["descs"] for c in prepped], float)
    wp = np.array([c["post_ms"] + c["wait_ms"] for c in prepped])
    slope_prepped = float(np.linalg.lstsq(np.c_[np.ones_like(dp), dp], wp, rcond=None)[0][1])
    return {"chunks": len(cs), "modes": sorted({c["mode"] for c in cs}),
            "chunk_ms": round(float(coef[0]), 3), "per_descriptor_ns": round(float(coef[1]) * 1e6, 2),
            "ms_per_mb": round(float(coef[2]), 5), "gb_s": round(1 / float(coef[2]), 1) if coef[2] > 0 else None,
            "median_abs_rel_err": round(float(np.median(rel)), 3),
            "prepped_only_per_descriptor_ns": round(slope_prepped * 1e6, 2),
            "descriptors_median": {m: statistics.median(c["descs"] for c in cs if c["mode"] == m) for m in sorted({c["mode"] for c in cs})},
            "post_wait_ms_median": {m: round(statistics.median(c["post_ms"] + c["wait_ms"] for c in cs if c["mode"] == m), 3)
                                    for m in sorted({c["mode"] for c in cs})}}


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def pair_model(arch: ModelArchitecture, gpu: str, quantization: str, role: str, **server) -> EngineCostModel:
    return build_cost_model(arch, gpu, quantization, role=role, **server)


def predict_parts(prefill: EngineCostModel, decode: EngineCostModel, prompts: list[int], concurrency: int) -> dict:
    """The per-request parts (ms) of `prompts` sent at once to a prefill + decode pair on one host (see the module doc)."""
    chunk = prefill.prefill_chunk_tokens()
    median_prompt = int(statistics.median(prompts))
    per_batch = max(1, min(concurrency, chunk // max(1, median_prompt)))
    worker = [prefill.kv_transfer_s(p, same_node=True) * 1e3 for p in prompts]
    queue = [(i % per_batch) * statistics.mean(worker) for i in range(len(prompts))]
    step_ms = decode.decode_step_s(concurrency, concurrency * (median_prompt + 16)) * 1e3
    notice = [step_ms * ((i * 0.618034) % 1.0) for i in range(len(prompts))]  # uniform over one decode step
    seen = [q + w + n for q, w, n in zip(queue, worker, notice)]
    forward_ms = prefill.prefill_time_s([median_prompt] * per_batch) * 1e3
    parts = {"queue": queue, "worker": worker, "decode_notice": notice, "ready_to_seen": seen}
    out: dict[str, object] = {k: {"p50": round(_pct(v, 0.5), 2), "p90": round(_pct(v, 0.9), 2)} for k, v in parts.items()}
    out["send_delay_ms"] = round(forward_ms, 1)
    out["requests_per_prefill_batch"] = per_batch
    out["worker_busy_per_batch_ms"] = round(per_batch * statistics.mean(worker), 2)
    out["descriptors_per_request_per_rank"] = prefill.kv_descriptors(median_prompt)
    out["chunks_per_request"] = round(prefill.kv_chunks(median_prompt), 3)
    out["kv_mb_per_request_per_rank"] = round(median_prompt * prefill.kv_bytes_per_gpu_token() / 1e6, 2)
    out["decode_step_ms"] = round(step_ms, 2)
    return out


def cmd_fit(_: argparse.Namespace) -> None:
    for label, name in CALLS.items():
        pre, _dec = _logs(name)
        print(label, json.dumps(fit_chunks(pre)))


def prompts_of(args: argparse.Namespace) -> list[int]:
    """`concurrency` prompts: all `prompt` tokens, or spread evenly over --prompt-range LO,HI (its quantiles)."""
    if not args.prompt_range:
        return [args.prompt] * args.concurrency
    lo, hi = (int(x) for x in args.prompt_range.split(","))
    return [int(lo + (hi - lo) * (i + 0.5) / args.concurrency) for i in range(args.concurrency)]


def cmd_predict(args: argparse.Namespace) -> None:
    arch = ModelArchitecture.from_hf_config(ROOT / args.model / "config.json")
    for layers in [int(x) for x in args.layers.split(",")] if args.layers else [arch.num_hidden_layers]:
        shape = replace(arch, num_hidden_layers=layers)
        for page in [int(x) for x in args.page_sizes.split(",")]:
            server = dict(tp=args.tp, page_size=page, chunked_prefill_tokens=args.chunk, load_format="dummy",
                          mem_fraction_static=args.mem_fraction, attention_backend=args.attention_backend)
            pre = pair_model(shape, args.gpu, args.quantization, "prefill", **server)
            dec = pair_model(shape, args.gpu, args.quantization, "decode", **server)
            parts = predict_parts(pre, dec, prompts_of(args), args.concurrency)
            print(json.dumps({"layers": layers, "page_size": page, "prompts": args.prompt_range or args.prompt,
                              "concurrency": args.concurrency,
                              "tp": args.tp, "gpu": args.gpu, **parts}))


def cmd_check(_: argparse.Namespace) -> None:
    pre_log, dec_log = _logs(CALLS["call2 (2 x H200, NVLink)"])
    rows = [r for r in requests(pre_log, dec_log) if r["mode"] == "prepped" and r["shard"] == "dst"]  # SGLang as shipped
    measured = summary(rows)
    prompts = [int(r["bytes"] / (27 * 1152)) for r in rows]
    server = dict(tp=1, page_size=1, chunked_prefill_tokens=8192, load_format="dummy", mem_fraction_static=0.5,
                  attention_backend="triton")
    pre = pair_model(DEEPSEEK_V2_LITE, "H200", "bf16", "prefill", **server)
    dec = pair_model(DEEPSEEK_V2_LITE, "H200", "bf16", "decode", **server)
    print("measured (call 2, SGLang as shipped: prepped path, queue by destination):", json.dumps(measured))
    print("model (in-sample):", json.dumps(predict_parts(pre, dec, prompts, 96)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fit")
    sub.add_parser("check")
    pr = sub.add_parser("predict")
    pr.add_argument("--model", default="models/qwen3-235b-a22b-fp8-l6")
    pr.add_argument("--gpu", default="H200")
    pr.add_argument("--quantization", default="fp8")
    pr.add_argument("--layers", default="")
    pr.add_argument("--page-sizes", default="1,16,64")
    pr.add_argument("--prompt", type=int, default=4000)
    pr.add_argument("--prompt-range", default="", help="LO,HI: prompts spread evenly over [LO, HI) instead of --prompt")
    pr.add_argument("--concurrency", type=int, default=16)
    pr.add_argument("--tp", type=int, default=1)
    pr.add_argument("--chunk", type=int, default=8192)
    pr.add_argument("--mem-fraction", type=float, default=0.85)
    pr.add_argument("--attention-backend", default="triton")
    args = p.parse_args()
    {"fit": cmd_fit, "predict": cmd_predict, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    main()
