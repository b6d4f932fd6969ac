"""Lease 18 (issue 25): KV transfer of a Qwen3-shaped (GQA, FP8 weights) PD pair vs page size and layer count.

    python benchmarks/lease18_kv.py predict [--json OUT]      # the planner's per-request KV time at every grid point
    python benchmarks/lease18_kv.py read RAW.json[.xz] ... [--hkv PREDICTED]   # measured vs each registered prediction

The grid: `calibrate pd` (scripts/device/calibrate.sh pd, PD_MODEL=qwen3) with prefill on GPU 0 and decode on GPU 1, FA3,
page sizes PAGES, layer counts LAYERS, 96 requests at once with prompt lengths U[256, 2048) (the harness's seed, so the
lengths are known here), 32 output tokens. The model's per-request KV time (`kv_transfer_s`: the transfer worker's chunks + bytes)
runs from SGLang's enqueue of the last chunk to the decode holding the KV: the measured `ready_to_seen` (enqueued ->
decode sees, orchestrator/calibrate/kvtimeline.py). The overlap loop's wait before the enqueue (`send_delay`) is the
simulator's held batch, not this term.

Registered classes (benchmarks/results/2026-11-27-lease18-predicted/README.md), each on the base mode's median over
loads of the per-load p50:
  descriptors  D = ready_to_seen(page 1) / ready_to_seen(page 64), same layers: >= 10 per descriptor, <= 1.5 not by
               descriptors (bytes or per request), else mixed. The same ratio of worker_all (NIXL's post + wait summed
               over a request's chunks) is read beside it.
  layers       R = ready_to_seen(12 layers) / ready_to_seen(6 layers), same page: >= 1.7 per layer, <= 1.3 per
               request, else mixed.
  queue        base vs shard (queue by room: four workers, not one): queue share = queue p50 / ready_to_seen p50 in
               base >= 0.3 and base/shard ready_to_seen >= 1.5: queue serialisation; share <= 0.1: not queued; else
               mixed. Beside it: the rank correlation of a base request's queue wait with the chunks ahead of it.
"""

from __future__ import annotations

import argparse
import json
import lzma
import random
import statistics
import sys
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.eager_host_read import spearman  # noqa: E402
from orchestrator.calibrate import kvtimeline  # noqa: E402
from orchestrator.config.model_presets import MODEL_PRESETS  # noqa: E402
from orchestrator.perfmodel.costmodel import build_cost_model  # noqa: E402

QWEN3 = MODEL_PRESETS["qwen3-235b-a22b-fp8"]
GPUS = ("H100-SXM", "H200")
LAYERS = (6, 12)
PAGES = (1, 64, 16)
# orchestrator/calibrate/pd.py run_pd's defaults: the load's prompt lengths are drawn from Random(SEED + 100 + rep)
SEED, N_REQUESTS, LEN_RANGE, REPS = 2025, 96, (256, 2048), 2
KV_BUFFERS = 2  # GQA: a K and a V buffer per layer (MLA: one latent buffer)
DESCRIPTOR_HIGH, DESCRIPTOR_LOW = 10.0, 1.5
LAYER_HIGH, LAYER_LOW = 1.7, 1.3
QUEUE_SHARE_HIGH, QUEUE_SHARE_LOW, SHARD_GAIN = 0.3, 0.1, 1.5


def prompt_lengths() -> list[int]:
    out = []
    for rep in range(REPS):
        rng = random.Random(SEED + 100 + rep)
        out += [rng.randrange(*LEN_RANGE) for _ in range(N_REQUESTS)]
    return out


def server(gpu: str, layers: int, page: int):
    """The lease's prefill server as the planner prices it: TP 1, FA3, dummy weights, KV dtype auto (bf16)."""
    return build_cost_model(replace(QWEN3, num_hidden_layers=layers), gpu, "fp8", tp=1, ep=1, page_size=page,
                            attention_backend="fa3", load_format="dummy", role="prefill")


def descriptors(length: int, layers: int, page: int) -> int:
    """NIXL descriptors of one request on SGLang's prepped path: one per page per KV buffer per layer."""
    return -(-length // page) * layers * KV_BUFFERS


def predict_point(gpu: str, layers: int, page: int, lengths: list[int]) -> dict[str, Any]:
    m = server(gpu, layers, page)
    per = [1e3 * m.kv_transfer_s(n, same_node=True) for n in lengths]
    # the per-request part beyond the bytes: the transfer worker's chunks (and descriptors, at no measured cost) since
    # the KV mechanism of 2026-11-27; main registered the 2 ms fallback here before the lease (lease18-predicted/)
    source = "worker: chunks x kv_chunk_s + descriptors x KV_DESCRIPTOR_S"
    return {"gpu": gpu, "layers": layers, "page": page, "delay_source": source,
            "delay_ms": round(statistics.mean(1e3 * m.kv_transfer_fixed_s(n) for n in lengths), 4),
            "link_ms_mean": round(statistics.mean(1e3 * m.kv_transfer_link_s(n, True) for n in lengths), 4),
            "kv_transfer_ms_p50": round(statistics.median(per), 4), "kv_transfer_ms_mean": round(statistics.mean(per), 4),
            "kv_bytes_per_token": m.kv_bytes_per_gpu_token(),
            "bytes_per_request_mean": round(statistics.mean(n * m.kv_bytes_per_gpu_token() for n in lengths)),
            "descriptors_per_request_mean": round(statistics.mean(descriptors(n, layers, page) for n in lengths), 1)}


def predict() -> dict[str, Any]:
    lengths = prompt_lengths()
    points = [predict_point(g, L, p, lengths) for g in GPUS for L in LAYERS for p in PAGES]
    return {"lengths": {"n": len(lengths), "mean": round(statistics.mean(lengths), 1), "min": min(lengths),
                        "max": max(lengths)}, "points": points}


def print_predictions(res: dict) -> None:
    ln = res["lengths"]
    print(f"prompt lengths (two reps of 96): mean {ln['mean']}, {ln['min']}..{ln['max']}")
    print("| GPU | layers | page | descriptors/request | MB/request | link ms | delay ms (source) | model KV ms p50 |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for p in res["points"]:
        print(f"| {p['gpu']} | {p['layers']} | {p['page']} | {p['descriptors_per_request_mean']:,.0f} | "
              f"{p['bytes_per_request_mean'] / 1e6:.2f} | {p['link_ms_mean']:.3f} | {p['delay_ms']} ({p['delay_source']}) | "
              f"{p['kv_transfer_ms_p50']:.3f} |")


def _load(path: Path) -> dict:
    with (lzma.open if path.suffix == ".xz" else open)(path, "rt") as raw:
        return json.load(raw)


def _layers(raw: dict) -> int:
    return int(raw["model"]["config"]["num_hidden_layers"])


def points(raws: list[dict]) -> dict[tuple[int, int, str], dict]:
    """(layers, page, mode) -> medians over loads of the per-load p50 / p90 of every part, loads, descs/request."""
    out: dict[tuple[int, int, str], dict] = {}
    for raw in raws:
        for page in raw["pages"]:
            for mode, r in (page.get("by_mode") or {}).items():
                loads = [ld for ld in page["loads"] if ld.get("mode") == mode and "timeline" in ld]
                row: dict[str, Any] = {part: (r.get(part + "_p50_median"), r.get(part + "_p90_median"))
                                       for part in kvtimeline.PARTS}
                row["loads"] = r["loads"]
                row["descs"] = statistics.median(ld["timeline"]["descs_per_request_mean"] for ld in loads) if loads else None
                row["queues_used"] = sorted({q for ld in loads for q in ld["timeline"]["queues_used"]})
                out[(_layers(raw), page["page_size"], mode)] = row
    return out


def p50(row: dict | None, part: str) -> float | None:
    return None if row is None else row[part][0]


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def descriptor_class(d: float | None) -> str:
    if d is None:
        return "not measured"
    return "per descriptor" if d >= DESCRIPTOR_HIGH else "not by descriptors" if d <= DESCRIPTOR_LOW else "mixed"


def layer_class(r: float | None) -> str:
    if r is None:
        return "not measured"
    return "per layer" if r >= LAYER_HIGH else "per request" if r <= LAYER_LOW else "mixed"


def queue_class(share: float | None, shard_gain: float | None) -> str:
    if share is None:
        return "not measured"
    if share >= QUEUE_SHARE_HIGH and shard_gain is not None and shard_gain >= SHARD_GAIN:
        return "queue serialisation"
    return "not queued" if share <= QUEUE_SHARE_LOW else "mixed"


def rank_corr(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho (average ranks for ties); None below three points."""
    return spearman(xs, ys) if len(xs) >= 3 else None


def depth_corr(logs: Path, page: int) -> float | None:
    """Base-mode requests of one page's logs (the server pair's whole life): rank correlation of the queue wait with
    the chunks ahead at enqueue."""
    with tarfile.open(logs) as tar:
        def text(role: str) -> str:
            names = [n for n in tar.getnames() if n.endswith(f"/pd-{role}-page{page}.log")]
            f = tar.extractfile(names[0]) if names else None
            return f.read().decode(errors="replace") if f else ""
        rows = kvtimeline.requests(text("prefill"), text("decode"))
    base = [r for r in rows if r["shard"] == "dst" and r["queue"] is not None and r["depth"] >= 0]
    return rank_corr([float(r["depth"]) for r in base], [r["queue"] for r in base])


def hkv_predictions(path: Path, gpu: str) -> dict[tuple[int, int], dict]:
    """(layers, page) -> hkv's mechanism's point (`benchmarks/kv_mechanism.py predict` JSON lines under '### GPU')."""
    out, current = {}, None
    for line in path.read_text().splitlines():
        if line.startswith("### "):
            current = line[4:].strip()
        elif line.startswith("{") and current == gpu:
            p = json.loads(line)
            out[(p["layers"], p["page_size"])] = p
    return out


def read(paths: list[Path], gpu: str, hkv: Path | None = None) -> int:
    raws = [_load(p) for p in paths]
    got = points(raws)
    pred = {(p["layers"], p["page"]): p for p in predict()["points"] if p["gpu"] == gpu}
    mech = hkv_predictions(hkv, gpu) if hkv else {}
    print(f"measured ({gpu}) vs the planner (main's kv_transfer_s); ms, median over loads of per-load p50 / p90")
    print("| layers | page | mode | loads | descs/req | enqueued -> decode sees | queue | NIXL (last chunk) | NIXL all chunks "
          "| decode notice | KV computed -> decode sees | send delay | model p50 | measured p50 / model "
          "| hkv p50 / p90 | measured p50 / hkv |")
    print("|---:|---:|---|---:|---:|---|---|---|---|---|---|---|---:|---:|---|---:|")
    for (L, page, mode), r in sorted(got.items()):
        m = pred.get((L, page))
        cells = " | ".join(f"{r[k][0]} / {r[k][1]}" for k in ("ready_to_seen", "queue", "worker", "worker_all",
                                                              "decode_notice", "computed_to_seen", "send_delay"))
        mp = m["kv_transfer_ms_p50"] if m else None
        x = ratio(r["ready_to_seen"][0], mp)
        h = mech.get((L, page))
        hp = h["ready_to_seen"]["p50"] if h else None
        hx = ratio(r["ready_to_seen"][0], hp)
        hcell = f"{hp} / {h['ready_to_seen']['p90']}" if h else ""
        print(f"| {L} | {page} | {mode} | {r['loads']} | {r['descs']} | {cells} | {mp} | "
              f"{'' if x is None else f'{x:.1f}x'} | {hcell} | "
              f"{'' if hx is None else f'{hx:.2f}x'} |")
    print("\nclass: descriptors (base, p50 page 1 / page 64)")
    for L in sorted({k[0] for k in got}):
        a, b = got.get((L, 1, "base")), got.get((L, 64, "base"))
        d = ratio(p50(a, "ready_to_seen"), p50(b, "ready_to_seen"))
        w = ratio(p50(a, "worker_all"), p50(b, "worker_all"))
        print(f"  {L} layers: D = {None if d is None else round(d, 2)} -> {descriptor_class(d)}; "
              f"NIXL all chunks {None if w is None else round(w, 2)} -> {descriptor_class(w)}")
    print("class: layers (base, p50 12 layers / 6 layers)")
    for page in sorted({k[1] for k in got}):
        a, b = got.get((12, page, "base")), got.get((6, page, "base"))
        lr = ratio(p50(a, "ready_to_seen"), p50(b, "ready_to_seen"))
        w = ratio(p50(a, "worker_all"), p50(b, "worker_all"))
        print(f"  page {page}: R = {None if lr is None else round(lr, 2)} -> {layer_class(lr)}; "
              f"NIXL all chunks {None if w is None else round(w, 2)} -> {layer_class(w)}")
    print("class: queue (base queue share of enqueued -> decode sees; base / shard)")
    for (L, page, mode), r in sorted(got.items()):
        if mode != "base":
            continue
        s = got.get((L, page, "shard"))
        share = ratio(r["queue"][0], r["ready_to_seen"][0])
        gain = ratio(r["ready_to_seen"][0], p50(s, "ready_to_seen"))
        corr = None
        for p, raw in zip(paths, raws):
            logs = p.parent / p.name.replace("calibration-", "logs-").replace(".json.xz", ".tar.xz").replace(".json", ".tar.xz")
            if _layers(raw) == L and logs.is_file():
                corr = depth_corr(logs, page)
        print(f"  {L} layers page {page}: queues {r['queues_used']}, share {None if share is None else round(share, 2)}, "
              f"base/shard {None if gain is None else round(gain, 2)}, rank corr(queue wait, chunks ahead) "
              f"{None if corr is None else round(corr, 2)} -> {queue_class(share, gain)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("predict", help="the planner's per-request KV time at every grid point")
    pr.add_argument("--json", type=Path, help="also write the points here")
    rd = sub.add_parser("read", help="measured vs the registered predictions, class verdicts")
    rd.add_argument("raw", nargs="+", type=Path, help="calibration-pd JSON (.json or .json.xz), logs-*.tar.xz beside it")
    rd.add_argument("--gpu", choices=GPUS, default="H100-SXM", help="the GPU the lease came as (the prediction's)")
    rd.add_argument("--hkv", type=Path, help="hkv's registered predictions (predicted-hkv.txt)")
    a = p.parse_args(argv)
    if a.cmd == "predict":
        res = predict()
        print_predictions(res)
        if a.json:
            a.json.write_text(json.dumps(res, indent=1) + "\n")
        return 0
    return read(a.raw, a.gpu, a.hkv)


if __name__ == "__main__":
    raise SystemExit(main())
