"""The KV hand-off of SGLang 0.5.17 PD by its mechanism: the transfer worker's constants fitted from the PDO_NIXL lines,
and the per-request parts the planner's simulation gives a PD pair, request by request against the measured ones.

    .venv/bin/python benchmarks/kv_mechanism.py fit
    .venv/bin/python benchmarks/kv_mechanism.py predict --model models/qwen3-235b-a22b-fp8-l6 --gpu H200 \
        [--quantization fp8] [--layers 6,12] [--page-sizes 1,16,64] [--prompt 4000 | --prompt-range 256,2048] \
        [--concurrency 16] [--tp 1] [--chunk 8192] [--mem-fraction 0.85] [--enqueue-interval-ms MS]
    .venv/bin/python benchmarks/kv_mechanism.py check [--lease18] [--enqueue-interval-ms MS]

fit: every `PDO_NIXL` chunk line (orchestrator/calibrate/kvtimeline.chunks) of the prefill log of
benchmarks/results/2026-11-24-kv-transfer-h100-s5 call 2 (V2-Lite shape, 27 layers, page 1; prefill on one H200,
decode on another of the same host, NVLink; transfer queue by destination, SGLang's own) in both its sender modes:
SGLang's prepped path (one descriptor per slot per layer) and the coalesced one (one per run of slots, ~1,000x
fewer). Least squares of a chunk's post + wait on [1, descriptors, MB]: the intercept is gpus.GpuSpec.kv_chunk_s,
the MB slope the KV path's NVLink rate (kv_transfer.KV_NVLINK_SHARE of 450 GB/s), the descriptor slope
kv_transfer.KV_DESCRIPTOR_S (0 where it is not positive). Beside it the gaps between consecutive enqueues on SGLang's
queue: a batch's requests are enqueued one by one as the result processing reaches each (gaps under ENQUEUE_PASS_S;
their median is kv_transfer.KV_ENQUEUE_INTERVAL_S). The same on call 1 (both servers on one H100) is printed beside
it: there the worker waits for the GPU the prefill keeps busy, which the constants do not describe.

predict: one load of `concurrency` requests of `prompt` tokens sent at once (the calibrate pd harness's load) to a PD
pair of one prefill and one decode server of the given shape on two GPUs of one host (NVLink), run through the
planner's Simulation (plan/simulation/simulate.py: overlap loop, one transfer worker, the prefill's poll), per page
size: descriptors per request per rank, and the parts (ms, p50 / p90 over the load's requests):
  queue          enqueued -> the worker takes it (behind earlier requests on the one worker)
  worker         the worker's time (chunks x kv_chunk_s + descriptors x KV_DESCRIPTOR_S + bytes at the NVLink KV rate)
  decode notice  NIXL done -> the decode's next scheduler turn
  enqueued -> decode sees  the three together

check: the measured loads themselves through the same simulation: call 2 of 2026-11-24 (V2-Lite, H200, page 1;
in-sample: the constants come from its chunks), or with --lease18 lease 18's four points (Qwen3-shaped FP8, 6 and 12
layers, page 1 and 64, FA3; out-of-sample). Each load of 96 requests (SGLang as shipped: prepped path, queue by
destination; the loads split where enqueues pause over LOAD_GAP_S) is simulated as sent at once with its requests'
prompt lengths (bytes / KV bytes per token) and the harness's 32 output tokens; the simulated requests are matched
to the measured ones by prompt length. Printed per point: both sides' p50 / p90 of every part and the median absolute
per-request error of enqueued -> decode sees. --enqueue-interval-ms 0 reruns it as the model was before the enqueue
interval (a batch's KV enqueued at one instant).
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

from orchestrator.calibrate.kvtimeline import chunks, pct, requests  # noqa: E402
from orchestrator.config.model_presets import DEEPSEEK_V2_LITE, MODEL_PRESETS, ModelArchitecture  # noqa: E402
from orchestrator.perfmodel.costmodel import EngineCostModel, build_cost_model  # noqa: E402
from orchestrator.perfmodel.scheduling.limits import server_limits  # noqa: E402
from orchestrator.perfmodel.scheduling.steps import StepScheduler  # noqa: E402
from orchestrator.plan.simulation import simulate  # noqa: E402
from orchestrator.plan.simulation.servers import SimServer  # noqa: E402

S5 = ROOT / "benchmarks" / "results" / "2026-11-24-kv-transfer-h100-s5"
CALLS = {"call2 (2 x H200, NVLink)": "logs-pd-call2-h200x2.tar.xz", "call1 (1 x H100, both servers)": "logs-pd-call1.tar.xz"}
LEASE18 = ROOT / "benchmarks" / "results" / "2026-11-27-lease18-h200x2"
LEASE18_CALLS = {6: "call9-l6/logs-q3l6.tar.xz", 12: "call10-l12/logs-q3l12.tar.xz"}
ENQUEUE_PASS_S = 5e-3  # consecutive enqueues closer than this are one result-processing pass (call 2: a trough at 3-6 ms)
LOAD_GAP_S = 0.3  # enqueues pausing longer than this separate the harness's loads (within one: under 0.2 s)
LOAD_REQUESTS, MAX_NEW = 96, 32  # orchestrator/calibrate/pd.py run_pd's defaults: the measured loads
PARTS = ("queue", "worker", "decode_notice", "ready_to_seen")


def _logs(name: str, page: int = 1, base: Path = S5) -> tuple[str, str]:
    """(prefill log, decode log) of a call's pair at `page`."""
    with tarfile.open(base / name) as tar:
        texts = {}
        for member in tar.getmembers():
            f = tar.extractfile(member) if member.name.endswith(f"-page{page}.log") else None
            if f is not None:
                texts[member.name] = f.read().decode()
    pre = next(t for n, t in texts.items() if "prefill" in n)
    dec = next(t for n, t in texts.items() if "decode" in n)
    return pre, dec


def enqueue_gaps_ms(prefill_log: str) -> list[float]:
    """Gaps between consecutive enqueues on SGLang's own queue within one result-processing pass (ms)."""
    t = sorted(c["t_enq"] for c in chunks(prefill_log) if c["shard"] == "dst" and c["t_enq"] > 0)
    return [(b - a) * 1e3 for a, b in zip(t, t[1:]) if b - a < ENQUEUE_PASS_S]


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
                                    for m in sorted({c["mode"] for c in cs})},
            "enqueue_gaps": len(gaps := enqueue_gaps_ms(prefill_log)),
            "enqueue_interval_ms_median": round(statistics.median(gaps), 3)}


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def pair_model(arch: ModelArchitecture, gpu: str, quantization: str, role: str, **server) -> EngineCostModel:
    return build_cost_model(arch, gpu, quantization, role=role, **server)


def simulate_loads(prefill: EngineCostModel, decode: EngineCostModel, loads: list[list[int]]) -> list[list[dict]]:
    """Each load's prompts sent at once to one prefill and one decode server of one host (NVLink) through the planner's
    Simulation (SGLang's overlap loop, the prefill's poll): per load, per request its prompt and parts (ms)."""
    out = []
    for prompts in loads:
        pair = [SimServer(f"{m.role}-0-0", m.role, "host", m, StepScheduler(server_limits(m), m, overlap_launch=True),
                          overlap=m.role == "prefill", polls_transfers=m.role == "prefill") for m in (prefill, decode)]
        sim = simulate.Simulation(pair[:1], pair[1:], [], answer_s=0.0)
        sim.run([(p, MAX_NEW) for p in prompts], None)
        rows = []
        for r in sim.requests:
            enq, start, done, seen = r.kv_enqueued_s, r.kv_started_s, r.kv_done_s, r.first_token_s
            assert enq is not None and start is not None and done is not None and seen is not None
            rows.append({"prompt": r.prompt_len, "queue": (start - enq) * 1e3, "worker": (done - start) * 1e3,
                         "decode_notice": (seen - done) * 1e3, "ready_to_seen": (seen - enq) * 1e3})
        out.append(rows)
    return out


def parts_summary(rows: list[dict]) -> dict:
    return {k: {"p50": pct([r[k] for r in rows], 0.5), "p90": pct([r[k] for r in rows], 0.9)} for k in PARTS}


def _rounded(d: dict) -> dict:
    return {k: {q: round(v, 2) for q, v in x.items()} for k, x in d.items()}


def measured_loads(prefill_log: str, decode_log: str, bytes_per_token: float) -> list[list[dict]]:
    """The harness's loads of LOAD_REQUESTS requests on SGLang's own path (prepped, queue by destination), each
    request's row (kvtimeline.requests) with its prompt length. Requests in first-enqueue order split into loads where
    the sender mode changes or enqueues pause over LOAD_GAP_S; a run of another size (the warm-ups, the logprob
    prompts, a load a pause split) is left out."""
    first_enq: dict[str, float] = {}
    for c in chunks(prefill_log):
        if c["t_enq"] > 0:
            first_enq[c["room"]] = min(first_enq.get(c["room"], c["t_enq"]), c["t_enq"])
    rows = sorted((r for r in requests(prefill_log, decode_log) if r["room"] in first_enq),
                  key=lambda r: first_enq[r["room"]])
    loads: list[list[dict]] = []
    for r in rows:
        last = loads[-1][-1] if loads else None
        if (last is None or first_enq[r["room"]] - first_enq[last["room"]] > LOAD_GAP_S
                or (r["mode"], r["shard"]) != (last["mode"], last["shard"])):
            loads.append([])
        loads[-1].append({**r, "prompt": round(r["bytes"] / bytes_per_token)})
    return [load for load in loads if len(load) == LOAD_REQUESTS and load[0]["mode"] == "prepped"
            and load[0]["shard"] == "dst"]


def compare_point(label: str, prefill: EngineCostModel, decode: EngineCostModel, prefill_log: str,
                  decode_log: str) -> dict:
    """The measured loads of one point against the simulation of the same loads, request by request."""
    loads = measured_loads(prefill_log, decode_log, prefill.kv_bytes_per_gpu_token())
    simulated = simulate_loads(prefill, decode, [[r["prompt"] for r in load] for load in loads])
    errors = []
    for meas, sim in zip(loads, simulated):  # matched by prompt length (the loads' lengths are drawn, rarely equal)
        for m, s in zip(sorted(meas, key=lambda r: r["prompt"]), sorted(sim, key=lambda r: r["prompt"])):
            if m["ready_to_seen"] is not None:
                errors.append(abs(s["ready_to_seen"] - m["ready_to_seen"]))
    meas_rows = [r for load in loads for r in load if r["ready_to_seen"] is not None]
    return {"point": label, "loads": len(loads), "requests": len(meas_rows),
            "measured": _rounded(parts_summary(meas_rows)),
            "model": _rounded(parts_summary([r for load in simulated for r in load])),
            "ready_to_seen_median_abs_error_ms": round(statistics.median(errors), 2)}


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
            prompts = prompts_of(args)
            parts = _rounded(parts_summary(simulate_loads(pre, dec, [prompts])[0]))
            median_prompt = int(statistics.median(prompts))
            print(json.dumps({"layers": layers, "page_size": page, "prompts": args.prompt_range or args.prompt,
                              "concurrency": args.concurrency, "tp": args.tp, "gpu": args.gpu, **parts,
                              "descriptors_per_request_per_rank": pre.kv_descriptors(median_prompt),
                              "chunks_per_request": round(pre.kv_chunks(median_prompt), 3),
                              "kv_mb_per_request_per_rank": round(median_prompt * pre.kv_bytes_per_gpu_token() / 1e6, 2)}))


def cmd_check(args: argparse.Namespace) -> None:
    print(f"enqueue interval {simulate.KV_ENQUEUE_INTERVAL_S * 1e3:g} ms")
    if not args.lease18:  # call 2 of 2026-11-24: V2-Lite, H200, page 1, triton, fractions 0.5 / 0.95 (in-sample)
        pre_log, dec_log = _logs(CALLS["call2 (2 x H200, NVLink)"])
        server = dict(tp=1, page_size=1, chunked_prefill_tokens=8192, load_format="dummy", attention_backend="triton")
        pre = pair_model(DEEPSEEK_V2_LITE, "H200", "bf16", "prefill", mem_fraction_static=0.5, **server)
        dec = pair_model(DEEPSEEK_V2_LITE, "H200", "bf16", "decode", mem_fraction_static=0.95, cuda_graph_max_bs=128,
                         **server)
        _print_points([compare_point("call2 V2-Lite page 1", pre, dec, pre_log, dec_log)])
        return
    points = []
    for layers, name in LEASE18_CALLS.items():  # lease 18: Qwen3-shaped FP8, FA3, fractions 0.80 / 0.85 (out of sample)
        shape = replace(MODEL_PRESETS["qwen3-235b-a22b-fp8"], num_hidden_layers=layers)
        for page in (1, 64):
            pre_log, dec_log = _logs(name, page, LEASE18)
            server = dict(tp=1, ep=1, page_size=page, chunked_prefill_tokens=8192, load_format="dummy",
                          attention_backend="fa3")
            pre = pair_model(shape, "H200", "fp8", "prefill", mem_fraction_static=0.80, **server)
            dec = pair_model(shape, "H200", "fp8", "decode", mem_fraction_static=0.85, cuda_graph_max_bs=128, **server)
            points.append(compare_point(f"lease18 {layers} layers page {page}", pre, dec, pre_log, dec_log))
    _print_points(points)


def _print_points(points: list[dict]) -> None:
    """Each point, then the mean absolute percentage error of enqueued -> decode sees over them."""
    for point in points:
        print(json.dumps(point))
    for q in ("p50", "p90"):
        errs = [abs(p["model"]["ready_to_seen"][q] / p["measured"]["ready_to_seen"][q] - 1) for p in points]
        print(f"enqueued -> decode sees {q}: MAPE {100 * statistics.mean(errs):.1f} % over {len(points)} point(s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fit")
    ck = sub.add_parser("check")
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
    ck.add_argument("--lease18", action="store_true", help="lease 18's four points (out of sample) instead of call 2")
    for sp in (pr, ck):
        sp.add_argument("--enqueue-interval-ms", type=float, default=None,
                        help="the simulation's interval between a batch's enqueues (default: kv_transfer's)")
    args = p.parse_args()
    if args.cmd != "fit" and args.enqueue_interval_ms is not None:
        simulate.KV_ENQUEUE_INTERVAL_S = args.enqueue_interval_ms / 1e3
    {"fit": cmd_fit, "predict": cmd_predict, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    main()
