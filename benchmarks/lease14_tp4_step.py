"""The 94-layer Qwen3-235B-A22B step at the organisers' decode-worker shape (TP 4 x EP 4, one H100 host; issue 25, lease
14): the model's predictions before the run, and the measurement against them.

    predict [--json F]   every point of benchmarks/calibration/plans/lease14-qwen3-tp4-ep4.json as the model prices the
              probe's server (scripts/device/qwen3_tp4_probe.sh: dummy weights, Triton attention, the organisers' decode
              flags), term by term: the fixed time (per step + per layer, the H100's Qwen3 split of lease 12), the
              non-routed weights, the routed experts hit, the KV read, the TP all-reduces; beside it the planner's own
              decode worker of configs/qwen3-pd-2026.yaml (FA3, the published weights) at the same points; the prefill
              forwards of one, two and four 4,000-token prompts
    predict --attention-backend fa3 --gpu H200 --plan P   lease 16: the same probe with FA3 (SGLang's default on SM90,
              the organisers' backend; the carried sgl-kernel keeps flash_ops since slim_site_archive.sh FA3_WHEEL) on
              either GPU, at the points of plan P
    read RAW.json   the measured step of every graphed point against the prediction (error, inside the registered
              +-15 % throughput bound or not), the registered reading (F(94) = the median over the points of the
              measured step less the model's non-fixed part; the step's growth with batch and with context against the
              model's), the prefill latencies against the forwards, and the outcome class it falls in; each raw file
              is read against the model of its own server's attention backend (`derived.attention_backend`), and raw
              files of one host, layer count and context at two backends (lease 16's FA3 and Triton arms) or with and
              without FlashInfer's all-reduce fusion are set side by side point by point (`ab`)
    read RAW20.json RAW40.json   lease 17: two layer counts of one server setup give the line F(L) = a + b.L and the
              gap F(L) - the model's fixed part at each; gap(20) / gap(40) read per layer (<= 0.65), per step (>= 0.85)
              or between

    python3 benchmarks/manifest.py record --out benchmarks/results/2026-11-27-lease14-predicted --stdout output.txt -- \\
        .venv/bin/python benchmarks/lease14_tp4_step.py predict --json benchmarks/results/2026-11-27-lease14-predicted/predicted.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.config import load_config  # noqa: E402
from orchestrator.config.model_presets import MODEL_PRESETS  # noqa: E402
from orchestrator.perfmodel.costmodel import build_cost_model, cost_model_for  # noqa: E402
from orchestrator.perfmodel.from_raw import gpu_key  # noqa: E402
from orchestrator.perfmodel.server.engine_cost_model import EngineCostModel  # noqa: E402
from orchestrator.perfmodel.server.forward import ATTENTION_BACKEND_SPEED, WEIGHT_READ_EFFICIENCY  # noqa: E402

PLAN = ROOT / "benchmarks/calibration/plans/lease14-qwen3-tp4-ep4.json"
PRESET = ROOT / "configs/qwen3-pd-2026.yaml"
QWEN3 = MODEL_PRESETS["qwen3-235b-a22b-fp8"]
GPU = "H100-SXM"
DECODE_STEPS = 100  # orchestrator/calibrate/single.py: each decode point runs 100 greedy steps
GAP_FLOOR_S = 0.2e-3  # lease 17, registered: a gap at the larger layer count under 0.2 ms is not split
BOUND = 0.15  # registered: the model's tok/s (batch / step) within +-15 % of the measured
# the probe's server (the plan's flags + calibrate single's BASE_FLAGS), SGLang's defaults otherwise
PROBE_SERVER: dict[str, Any] = {"tp": 4, "ep": 4, "mem_fraction_static": 0.90, "max_running_requests": 256,
                                "context_length": 8192, "chunked_prefill_tokens": 8192, "attention_backend": "triton",
                                "load_format": "dummy", "prefill_graphs": False, "cuda_graph_max_bs": 256,
                                "page_size": 1, "role": "aggregated"}


def plan(path: Path | None = None) -> dict:
    (variant,) = json.loads((path or PLAN).read_text())
    return variant


def probe_model(gpu: str = GPU, layers: int | None = None, backend: str = "triton", tp: int = 4,
                heads: tuple[int, int] | None = None) -> EngineCostModel:
    """The probe's server: TP = EP = tp; heads = (query, KV) heads of the model (lease 16's two-GPU arms: 32 / 2, so each
    GPU has the 16 query heads and one KV head of the organisers' TP 4)."""
    arch = QWEN3 if layers is None else replace(QWEN3, num_hidden_layers=layers)
    if heads is not None:
        arch = replace(arch, num_attention_heads=heads[0], num_key_value_heads=heads[1])
    return build_cost_model(arch, gpu, "fp8", **{**PROBE_SERVER, "attention_backend": backend, "tp": tp, "ep": tp})


def preset_decode_model(gpu: str = GPU) -> EngineCostModel:
    """The planner's decode worker of the 2026 preset (the organisers' flags: FA3, published weights, PD decode)."""
    cfg = load_config(PRESET, paths_from=ROOT)
    _, _, group = next(g for g in cfg.layout.groups() if g[0] == "decode")
    return cost_model_for(cfg, "decode", group, gpu=gpu)


def terms(model: EngineCostModel, batch: int, kv_tokens: int) -> dict[str, float]:
    """The model's graphed step and its parts, seconds; they add up to the step (checked)."""
    cal = model.calibration
    assert cal is not None and cal.graph_step_s is not None and cal.graph_layer_s is not None, "no graphed floor"
    assert model._lent_floor and not model.decode_runs_eager(batch), "not the lent-floor graphed path"
    weights, routed = model._weight_bytes_read(batch)
    hbm = model.gpu.hbm_tb_s * 1e12
    backend = model.attention_speed / ATTENTION_BACKEND_SPEED.get(cal.attention_backend, 1.0)
    kv_bytes = kv_tokens * model.kv_bytes_per_gpu_token() / model.attn_dp
    parts = {
        "weights": (weights - routed) / (hbm * WEIGHT_READ_EFFICIENCY),
        "experts": routed / (hbm * (cal.graph_expert_read_share or WEIGHT_READ_EFFICIENCY)),
        "kv": kv_bytes / backend / (hbm * WEIGHT_READ_EFFICIENCY),
        "allreduce": model._comm_s(batch, None, eager=False, decode=True),
        "fixed": cal.graph_step_s + model.arch.num_hidden_layers * cal.graph_layer_s,
    }
    # Triton GQA attention beyond its KV bytes (server/triton_gqa.py; 0 before 2026-11-27 hctx)
    parts["attention_wait"] = model._triton_gqa_wait_s(batch, kv_tokens, parts["kv"])
    step = model.decode_step_s(batch, kv_tokens)
    memory = parts["weights"] + parts["experts"] + parts["kv"] + parts["attention_wait"]
    parts["compute_over_reads"] = max(0.0, step - memory - parts["allreduce"] - parts["fixed"])
    assert abs(sum(parts.values()) - step) < 1e-9, "the parts do not add up to the step"
    return {"step": step, **parts, "experts_hit_per_gpu": model._experts_hit_fraction(batch) * QWEN3.n_routed_experts / model.ep}


def pricing(model: EngineCostModel) -> str:
    """Which profiles price the server's graphed step and why (its own layer shape's, another model's with the same
    per-GPU shard, or the GPU's lent floor)."""
    cal = model.calibration
    assert cal is not None and cal.graph_step_s is not None and cal.graph_layer_s is not None
    split = f"fixed split {cal.graph_step_s * 1e3:.3f} ms + {cal.graph_layer_s * 1e6:.1f} us per layer"
    source = (f"from the layer counts {', '.join(map(str, cal.floor_counts))} of the Qwen3 layer on this GPU's host"
              if cal.floor_counts else "the GPU's lent cross-shape floor (no layer-count profile of this shape)")
    return f"{split}, {source}" + (f"; {cal.shard_note()}" if cal.shard_lender else "")


def points(plan_path: Path | None = None) -> list[tuple[int, int, int]]:
    """(batch, context per request, KV tokens mid-way through the point's 100 steps) of every decode point, in order."""
    v = plan(plan_path)
    half = DECODE_STEPS // 2
    return [(b, c, b * (c + half)) for c in v["decode_contexts"] for b in v["decode_batches"]]


def prefill_chunks(k: int, length: int, chunk: int) -> list[tuple[list[int], list[int]]]:
    """k prompts of `length` tokens sent at once, cut into forwards of at most `chunk` tokens as SGLang's chunked
    prefill does (a request split across two forwards resumes on its cached part): [(new tokens, cached tokens)]."""
    forwards, new, cached, room = [], [], [], chunk
    for _ in range(k):
        done = 0
        while done < length:
            take = min(length - done, room)
            new.append(take)
            cached.append(done)
            done += take
            room -= take
            if room == 0:
                forwards.append((new, cached))
                new, cached, room = [], [], chunk
    if new:
        forwards.append((new, cached))
    return forwards


def prefill_predictions(model: EngineCostModel) -> list[dict]:
    v = plan()
    rows = []
    for k, length in [(1, n) for n in v["prefill_lengths"]] + [tuple(x) for x in v["prefill_concurrent"]]:
        forwards = prefill_chunks(k, length, model.chunked_prefill_tokens or 8192)
        total = sum(model.prefill_time_s(new, cached) for new, cached in forwards)
        rows.append({"requests": k, "tokens_each": length, "forwards": len(forwards), "model_s": total})
    return rows


PARTS = ("fixed", "weights", "experts", "kv", "allreduce", "attention_wait", "compute_over_reads")


def predict(gpu: str = GPU, backend: str = "triton", plan_path: Path | None = None, layers: int | None = None,
            tp: int = 4, heads: tuple[int, int] | None = None) -> dict:
    probe, preset = probe_model(gpu, layers, backend, tp, heads), preset_decode_model(gpu)
    rows = []
    for batch, context, kv in points(plan_path):
        t = terms(probe, batch, kv)
        rows.append({"batch": batch, "context": context, "kv_tokens": kv,
                     **{k: round(v * 1e3, 4) for k, v in t.items() if k != "experts_hit_per_gpu"},
                     "experts_hit_per_gpu": round(t["experts_hit_per_gpu"], 2),
                     "preset_decode_ms": round(preset.decode_step_s(batch, kv) * 1e3, 4)})
    cal = probe.calibration
    assert cal is not None and cal.graph_step_s is not None and cal.graph_layer_s is not None
    return {"gpu": gpu, "layers": probe.arch.num_hidden_layers, "heads": [probe.arch.num_attention_heads, probe.arch.num_key_value_heads],
            "server": {**PROBE_SERVER, "attention_backend": backend, "tp": tp, "ep": tp},
            "kv_capacity_tokens": probe.kv_capacity_tokens(), "preset_kv_capacity_tokens": preset.kv_capacity_tokens(),
            "graphs": probe.graph_batch_sizes(),
            "fixed_split": {"per_step_ms": round(cal.graph_step_s * 1e3, 4), "per_layer_us": round(cal.graph_layer_s * 1e6, 2)},
            "calibration": pricing(probe), "bound": BOUND, "points": rows,
            "prefill": [{**r, "model_s": round(r["model_s"], 4)} for r in prefill_predictions(probe)]}


def print_predictions(result: dict) -> None:
    split = result["fixed_split"]
    tp = result["server"]["tp"]
    print(f"== {result['gpu']}, {result['layers']} layers, heads {result['heads'][0]} / {result['heads'][1]}, TP {tp} x EP {tp} "
          f"(the probe's server: {result['server']})")
    if "calibration" in result:
        print(f"calibration: {result['calibration']}")
    print(f"fixed time: {split['per_step_ms']} ms per step + {split['per_layer_us']} us per layer "
          f"-> {split['per_step_ms'] + result['layers'] * split['per_layer_us'] / 1e3:.2f} ms")
    print(f"KV capacity: the probe {result['kv_capacity_tokens']:,} tokens (the preset's decode worker "
          f"{result['preset_kv_capacity_tokens']:,}); largest point {max(p['kv_tokens'] for p in result['points']):,}")
    print(f"decode graphs the model assumes: {result['graphs']}")
    print(f"{'batch':>5} {'ctx':>5} {'kv':>7} {'model ms':>8} " + " ".join(f"{p:>9}" for p in PARTS[:-1])
          + f" {'compute>rd':>10} {'hit/GPU':>7} {'tok/s':>7} {'bound ms':>15} {'preset ms':>9}")
    for p in result["points"]:
        lo, hi = p["step"] / (1 + BOUND), p["step"] / (1 - BOUND)  # measured steps whose tok/s the model is within 15 % of
        print(f"{p['batch']:>5} {p['context']:>5} {p['kv_tokens']:>7} {p['step']:>8.3f} "
              + " ".join(f"{p[k]:>9.3f}" for k in PARTS[:-1]) + f" {p['compute_over_reads']:>10.3f}"
              + f" {p['experts_hit_per_gpu']:>7.2f} {p['batch'] / p['step'] * 1e3:>7.0f} {lo:>7.2f}-{hi:<7.2f} {p['preset_decode_ms']:>9.3f}")
    print("prefill (client latency of k prompts at once, max_new_tokens 1; the model: its forwards' sum):")
    for r in result["prefill"]:
        print(f"  {r['requests']} x {r['tokens_each']}: {r['forwards']} forward(s), model {r['model_s'] * 1e3:.1f} ms")


def measured(raw: dict) -> tuple[list[dict], list[dict]]:
    """Graphed decode rows (batch, context, kv, step s, repeat) and prefill rows of one raw file."""
    decode, prefill = [], []
    for run in raw["runs"]:
        for row in run.get("decode") or []:
            if row.get("step_ms_median") and not row.get("skipped"):
                batch = int(row.get("running_batch") or row["batch_size"])
                kv = int(row.get("kv_tokens_median") or batch * (row["context_tokens"] + DECODE_STEPS // 2))
                decode.append({"batch": batch, "asked": row["batch_size"], "context": row["context_tokens"], "kv": kv,
                               "step_s": row["step_ms_median"] / 1e3, "graph": bool(row.get("cuda_graph")),
                               "repeat": row.get("repeat", 0)})
        prefill += [r for r in run.get("prefill") or [] if r.get("latency_s_median")]
    return decode, prefill


def classify(f94_s: float, model_f94_s: float, batch_growth: float, context_growth: float) -> str:
    """The registered outcome classes (benchmarks/results/2026-11-27-lease14-predicted/README.md)."""
    out = []
    if abs(f94_s - model_f94_s) <= 0.15 * model_f94_s:
        out.append(f"fixed: as modelled (F within 15 % of the split's {model_f94_s * 1e3:.2f} ms)")
    elif f94_s < model_f94_s:
        out.append(f"fixed: LOWER than the split carried to 94 layers ({f94_s * 1e3:.2f} vs {model_f94_s * 1e3:.2f} ms)")
    else:
        out.append(f"fixed: HIGHER than the split ({f94_s * 1e3:.2f} vs {model_f94_s * 1e3:.2f} ms)")
    for name, ratio in (("batch growth (routed experts)", batch_growth), ("context growth (KV read)", context_growth)):
        if ratio != ratio:  # NaN: not measured
            out.append(f"{name}: not measured")
        else:
            verdict = "as modelled" if abs(ratio - 1) <= 0.25 else ("slower than modelled" if ratio > 1 else "faster than modelled")
            out.append(f"{name}: measured / model {ratio:.2f} ({verdict}; +-25 % counts as modelled)")
    return "; ".join(out)


def read(raw_paths: list[Path]) -> int:
    """Each raw file read alone (`read_one`), then, with two or more layer counts of one host, the split of F(L)."""
    fits = []
    for path in raw_paths:
        fit = read_one(path)
        if fit is None:
            return 1
        fits.append(fit)
    if len({fit[0] for fit in fits}) != 1:
        print("raw files of several GPUs: no split across them", file=sys.stderr)
        return 0 if len(fits) == 1 else 1
    for a, b in ab_pairs(fits):
        ab(a, b)
    setups = {(fit[5], fit[6]) for fit in fits}
    if len(setups) > 1:  # a split only across layer counts of one server setup
        fits = [fit for fit in fits if (fit[5], fit[6]) == ("triton", True)]
    if len({fit[1] for fit in fits}) < 2:
        return 0
    gpu, tp, (model_step_s, model_layer_s) = fits[0][0], fits[0][10], fits[0][11]
    step_s, layer_s = line([(layers, f) for _, layers, f, *_ in fits])
    print(f"split over {sorted(fit[1] for fit in fits)} layers at TP {tp} x EP {tp} on {gpu}: {step_s * 1e3:.3f} ms per step + "
          f"{layer_s * 1e6:.1f} us per layer (the model's split of this server: {model_step_s * 1e3:.3f} ms + "
          f"{model_layer_s * 1e6:.1f} us); F holds what the model's all-reduce term misprices")
    for _, layers, fixed, spread, *_ in sorted(fits, key=lambda f: f[1]):
        off = fixed - (step_s + layers * layer_s)
        print(f"  {layers} layers: F {fixed * 1e3:.3f} ms, the line {(step_s + layers * layer_s) * 1e3:.3f} ms, off by {off * 1e3:+.3f} ms "
              f"({'more' if abs(off) > 2 * spread else 'not more'} than twice the repeats' median spread {spread * 1e3:.3f} ms)")
    contexts = sorted(set.intersection(*(set(f[4]) for f in fits)))
    for context in contexts:  # added after the run: the split of each context's F alone
        per_step_s, per_layer_s = line([(f[1], f[4][context]) for f in fits])
        print(f"  context {context} alone: {per_step_s * 1e3:.3f} ms per step + {per_layer_s * 1e6:.1f} us per layer")
    if len(fits) == 2:
        short, long = sorted(fits, key=lambda f: f[1])
        gap_split(short, long, contexts)
    return 0


def gap_class(ratio: float) -> str:
    """Lease 17's registered classes of gap(L / 2) / gap(L) (benchmarks/results/2026-11-27-lease17-predicted/): a gap
    paid once per layer halves with the layers, one paid once per step stays."""
    if ratio <= 0.65:
        return "(a) PER LAYER"
    if ratio >= 0.85:
        return "(b) PER STEP"
    return "(c) BETWEEN"


def gap_split(short: tuple, long: tuple, contexts: list[int]) -> None:
    """The gap F(L) - the model's fixed part at two layer counts of one server setup (lease 17: 20 and 40 layers):
    its ratio read against the registered classes, over all graphed rows and per context."""
    for name, gap_short, gap_long in [("all rows", short[2] - short[9], long[2] - long[9])] + [
            (f"context {c}", short[4][c] - short[9], long[4][c] - long[9]) for c in contexts]:
        head = (f"gap {name}: F - the model's fixed part {gap_short * 1e3:+.3f} ms at {short[1]} layers, "
                f"{gap_long * 1e3:+.3f} ms at {long[1]}")
        if gap_long <= max(2 * max(short[3], long[3]), GAP_FLOOR_S):
            print(f"{head}; no gap to split at {long[1]} layers (not over twice the repeats' median spread nor "
                  f"{GAP_FLOOR_S * 1e3:.1f} ms)")
            continue
        ratio = gap_short / gap_long
        print(f"{head}; gap({short[1]}) / gap({long[1]}) = {ratio:.2f}: {gap_class(ratio)} "
              f"(registered: <= 0.65 per layer, >= 0.85 per step, between otherwise)")


def ab_pairs(fits: list[tuple]) -> list[tuple[tuple, tuple]]:
    """Lease 16's same-host pairs at one layer count: (FA3, Triton), both with the fusion off, and (fusion off, fusion
    on), both FA3."""
    pairs = []
    for a in fits:
        for b in fits:
            if a[1] != b[1]:
                continue
            if a[5] == "fa3" and a[6] and b[5] == "triton" and b[6]:
                pairs.append((a, b))
            if a[5] == b[5] == "fa3" and a[6] and not b[6]:
                pairs.append((a, b))
    return pairs


def ab(a: tuple, b: tuple) -> None:
    """Point by point, b's measured step less a's, beside what the model says the difference is, and the registered
    lease 16 outcome (benchmarks/results/2026-11-27-lease16-predicted/README.md)."""
    fusion = a[5] == b[5]
    name_a, name_b = ("fusion off", "fusion ON") if fusion else ("FA3", "Triton")
    layers, spread_a, spread_b = a[1], a[3], b[3]
    print(f"A/B on {a[0]}, {layers} layers: {name_b} - {name_a}, point by point (medians of the repeats)")
    print(f"{'batch':>5} {'ctx':>5} {name_a + ' ms':>14} {name_b + ' ms':>14} {'measured diff':>13} {'model diff':>10}"
          + ("" if not fusion else f" {'all-reduce ms':>13}"))
    same, shared = 0, sorted(set(a[7]) & set(b[7]), key=lambda k: (-k[1], k[0]))
    for key in shared:
        diff = b[7][key] - a[7][key]
        model_diff = b[8][key]["step"] - a[8][key]["step"]
        noise = max(2 * max(spread_a, spread_b), 0.03 * a[7][key])
        same += abs(diff) <= noise
        print(f"{key[0]:>5} {key[1]:>5} {a[7][key] * 1e3:>14.3f} {b[7][key] * 1e3:>14.3f} {diff * 1e3:>+13.3f} {model_diff * 1e3:>+10.3f}"
              + ("" if not fusion else f" {a[8][key]['allreduce'] * 1e3:>13.3f}"))
    if not shared:
        print("  no point measured by both")
        return
    print(f"points where the two differ by no more than max(twice the larger repeats' spread, 3 %): {same} of {len(shared)}")
    if fusion:
        saved = [(a[7][k] - b[7][k]) / a[8][k]["allreduce"] for k in shared]
        print(f"outcome (fusion): the fusion saves a median {statistics.median(saved):.2f} of the model's all-reduce term "
              f"({'nothing changes' if same >= 0.8 * len(shared) else 'a step difference beyond the repeats'})")
        return
    print("outcome (FA3 vs Triton):", classify_ab(a, b, same / len(shared)))


def context_growths(fit: tuple) -> tuple[list[float], list[float]]:
    """Per batch measured at both contexts: (step at the longest - at the shortest context) measured and modelled."""
    medians, modelled = fit[7], fit[8]
    contexts = sorted({c for _, c in medians})
    measured_g: list[float] = []
    model_g: list[float] = []
    if len(contexts) < 2:
        return measured_g, model_g
    for batch in sorted({b for b, _ in medians}):
        lo, hi = (batch, contexts[0]), (batch, contexts[-1])
        if lo in medians and hi in medians:
            measured_g.append(medians[hi] - medians[lo])
            model_g.append(modelled[hi]["step"] - modelled[lo]["step"])
    return measured_g, model_g


def classify_ab(fa3: tuple, triton: tuple, same_share: float) -> str:
    """The registered lease 16 classes: (nothing) FA3 and Triton within the noise at >= 80 % of the points; (removes)
    FA3's context growth at most half Triton's and as modelled (+-25 %, median ratio over batches where the model grows
    by > 0.1 ms); (own context cost) FA3's context growth over 1.25 x the model's and over half Triton's; and beside
    it, FA3's batch growth (1 -> 64 at the longest context) against the model's, +-25 %."""
    if same_share >= 0.8:
        return f"NOTHING CHANGES: FA3 and Triton within the noise at {same_share:.0%} of the points"
    out = []
    g_fa3, m_fa3 = context_growths(fa3)
    g_tri, _ = context_growths(triton)
    if g_fa3 and g_tri:
        half = statistics.median(g_fa3) <= 0.5 * statistics.median(g_tri)
        ratios = [g / m for g, m in zip(g_fa3, m_fa3) if m > 1e-4]
        ratio = statistics.median(ratios) if ratios else float("nan")
        print(f"context growth (median over batches): FA3 {statistics.median(g_fa3) * 1e3:+.3f} ms, Triton "
              f"{statistics.median(g_tri) * 1e3:+.3f} ms, the FA3 model {statistics.median(m_fa3) * 1e3:+.3f} ms "
              f"(FA3 measured / model {ratio:.2f})")
        if half and abs(ratio - 1) <= 0.25:
            out.append("FA3 REMOVES THE TRITON CONTEXT GROWTH (as modelled)")
        elif ratio > 1.25 and not half:
            out.append("FA3 HAS ITS OWN CONTEXT COST (over 1.25 x the model and over half Triton's)")
        else:
            out.append(f"context: neither registered class (FA3 at most half Triton's: {half}; FA3 / model {ratio:.2f})")
    medians, modelled = fa3[7], fa3[8]
    top = max(c for _, c in medians)
    batches = sorted(b for b, c in medians if c == top)
    if len(batches) >= 2:
        lo, hi = (batches[0], top), (batches[-1], top)
        ratio = (medians[hi] - medians[lo]) / (modelled[hi]["step"] - modelled[lo]["step"])
        verdict = "as modelled" if abs(ratio - 1) <= 0.25 else "FA3 BATCH SLOPE DIFFERS"
        out.append(f"FA3 batch growth {batches[0]} -> {batches[-1]} at {top}: measured / model {ratio:.2f} ({verdict})")
    return "; ".join(out)


def line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (per step, per layer) seconds through (layers, fixed seconds)."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def server_setup(raw: dict) -> tuple[str, bool]:
    """(attention backend, FlashInfer all-reduce fusion forced off) of a raw file's server: SGLang's resolved backend,
    else the variant's last --attention-backend flag (calibrate single's BASE_FLAGS say triton; a plan's flag comes
    after them and wins)."""
    run = raw["runs"][0]
    flags = run.get("flags") or []
    backend = (run.get("derived") or {}).get("attention_backend")
    if not backend:
        given = [flags[i + 1] for i, f in enumerate(flags[:-1]) if f == "--attention-backend"]
        backend = given[-1] if given else "triton"
    fusion_off = "--enforce-disable-flashinfer-allreduce-fusion" in flags or not run.get("flags")
    return backend, fusion_off


def read_one(raw_path: Path) -> tuple | None:
    """One raw file against the model at its own layer count, GPU and attention backend:
    (gpu, layers, F, repeats' median spread, F per context, backend, fusion off, point medians, modelled terms,
    the model's fixed part, TP, the model's fixed split (per step, per layer) in seconds)."""
    raw = json.loads(raw_path.read_text())
    gpu = gpu_key(raw["gpu"]["name"])
    config = raw["model"]["config"]
    layers = int(config["num_hidden_layers"])
    heads = (int(config.get("num_attention_heads", 64)), int(config.get("num_key_value_heads", 4)))
    backend, fusion_off = server_setup(raw)
    run = raw["runs"][0]
    flags = run.get("flags") or []
    tp = int((run.get("derived") or {}).get("tp_size") or (flags[flags.index("--tp-size") + 1] if "--tp-size" in flags else 4))
    model = probe_model(gpu, layers, backend, tp, heads)
    decode, prefill = measured(raw)
    print(f"on {gpu} ({raw['gpu']['name']}), {layers} layers, heads {heads[0]} / {heads[1]}, TP {tp} x EP {tp}, attention {backend}, FlashInfer all-reduce "
          f"fusion {'off' if fusion_off else 'ON'}: {len(decode)} decode rows, {len(prefill)} prefill rows")
    print(f"calibration: {pricing(model)}")
    print(f"{'batch':>5} {'ctx':>5} {'rep':>3} {'graph':>5} {'measured ms':>11} {'model ms':>8} {'step err':>8} {'tok/s err':>9} {'in bound':>8} {'F ms':>8}")
    fixed, inside, graphed = [], 0, [r for r in decode if r["graph"]]
    by_point: dict[tuple[int, int], list[float]] = {}
    by_context: dict[int, list[float]] = {}
    for r in decode:
        t = terms(model, r["batch"], r["kv"]) if r["graph"] else None
        step = t["step"] if t else model.decode_step_s(r["batch"], r["kv"])
        tok_err = step and (r["step_s"] / step - 1)  # model tok/s / measured tok/s - 1
        ok = abs(tok_err) <= BOUND
        inside += ok and r["graph"]
        f = r["step_s"] - (step - t["fixed"]) if t else float("nan")
        if t:
            fixed.append(f)
            by_context.setdefault(r["context"], []).append(f)
            by_point.setdefault((r["batch"], r["context"]), []).append(r["step_s"])
        print(f"{r['batch']:>5} {r['context']:>5} {r['repeat']:>3} {str(r['graph']):>5} {r['step_s'] * 1e3:>11.3f} {step * 1e3:>8.3f} "
              f"{step / r['step_s'] - 1:>+8.1%} {tok_err:>+9.1%} {'yes' if ok else 'NO':>8} {f * 1e3:>8.3f}")
    if not graphed:
        print("no graphed decode point measured: nothing to read", file=sys.stderr)
        return None
    f94 = statistics.median(fixed)
    spreads = [max(v) - min(v) for v in by_point.values() if len(v) > 1]
    spread = statistics.median(spreads) if spreads else 0.0
    model_f = terms(model, 1, 1)["fixed"]
    print(f"graphed points inside the +-{BOUND:.0%} tok/s bound: {inside} of {len(graphed)}")
    print(f"F({layers}) measured (median over {len(fixed)} graphed rows of measured - the model's non-fixed part): {f94 * 1e3:.3f} ms "
          f"(the model {model_f * 1e3:.3f} ms; repeats' median spread {spread * 1e3:.3f} ms)")

    def step_at(batch: int, context: int) -> tuple[float, float] | None:
        seen = by_point.get((batch, context))
        if not seen:
            return None
        kv = batch * (context + DECODE_STEPS // 2)
        return statistics.median(seen), model.decode_step_s(batch, kv)

    contexts = sorted({c for _, c in by_point})
    growth: dict[str, float] = {}
    for context in contexts:
        batches = sorted(b for b, c in by_point if c == context)
        lo, hi = step_at(batches[0], context), step_at(batches[-1], context)
        if lo and hi and batches[-1] > batches[0]:
            ratio = (hi[0] - lo[0]) / (hi[1] - lo[1])
            growth[f"batch@{context}"] = ratio
            print(f"context {context}: step {batches[0]} -> {batches[-1]} grew {(hi[0] - lo[0]) * 1e3:+.3f} ms measured, "
                  f"{(hi[1] - lo[1]) * 1e3:+.3f} ms modelled (measured / model {ratio:.2f})")
    ctx_ratios = []
    if len(contexts) >= 2:
        for batch in sorted({b for b, _ in by_point}):
            a, b = step_at(batch, contexts[0]), step_at(batch, contexts[-1])
            if a and b:
                if abs(b[1] - a[1]) > 1e-4:  # a ratio only where the model grows by more than 0.1 ms
                    ctx_ratios.append((b[0] - a[0]) / (b[1] - a[1]))
                print(f"batch {batch}: context {contexts[0]} -> {contexts[-1]} grew {(b[0] - a[0]) * 1e3:+.3f} ms measured, "
                      f"{(b[1] - a[1]) * 1e3:+.3f} ms modelled")
    top = f"batch@{contexts[-1]}"
    print("outcome:", classify(f94, model_f, growth.get(top, float("nan")),
                               statistics.median(ctx_ratios) if ctx_ratios else float("nan")))
    if prefill:
        print("prefill (client latency median of 3 after a first call; the model's forwards):")
        model_rows = {(r["requests"], r["tokens_each"]): r for r in prefill_predictions(model)}
        for r in prefill:
            m = model_rows.get((r["concurrency"], r["input_tokens"]))
            text = f"model {m['model_s'] * 1e3:.1f} ms ({m['model_s'] / r['latency_s_median'] - 1:+.1%})" if m else "no prediction"
            print(f"  {r['concurrency']} x {r['input_tokens']}: measured {r['latency_s_median'] * 1e3:.1f} ms, {text}")
    print()
    per_context = {c: statistics.median(v) for c, v in sorted(by_context.items())}
    print("F per context (added after the run, beside the registered F over both): "
          + ", ".join(f"{c}: {v * 1e3:.3f} ms" for c, v in per_context.items()))
    medians = {k: statistics.median(v) for k, v in by_point.items()}
    modelled = {(b, c): terms(model, b, b * (c + DECODE_STEPS // 2)) for b, c in medians}
    cal = model.calibration
    assert cal is not None and cal.graph_step_s is not None and cal.graph_layer_s is not None
    return gpu, layers, f94, spread, per_context, backend, fusion_off, medians, modelled, model_f, tp, (cal.graph_step_s, cal.graph_layer_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--json", type=Path, help="also write the predictions here")
    p.add_argument("--attention-backend", default="triton", choices=["triton", "fa3"],
                   help="the probe server's attention backend (lease 14: triton; lease 16: fa3)")
    p.add_argument("--gpu", default=GPU, help="the cost model's GPU key (H100-SXM, H200)")
    p.add_argument("--plan", type=Path, default=PLAN, help="the calibration plan whose decode points are priced")
    p.add_argument("--layers", type=int, help="layers of the model (default the published 94)")
    p.add_argument("--tp", type=int, default=4, help="TP = EP of the probe's server (lease 16's two-GPU arms: 2)")
    p.add_argument("--heads", help="query/KV heads of the model, e.g. 32/2 (default the published 64/4)")
    r = sub.add_parser("read")
    r.add_argument("raw", nargs="+", type=Path, help="calibration-q3l<L>-tp4ep4-lease14.json files (one host's: a split)")
    args = parser.parse_args(argv)
    if args.cmd == "read":
        return read(args.raw)
    heads = tuple(int(x) for x in args.heads.split("/")) if args.heads else None
    result = predict(args.gpu, args.attention_backend, args.plan, args.layers, args.tp, heads)  # type: ignore[arg-type]
    print_predictions(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
