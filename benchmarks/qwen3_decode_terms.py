"""The Qwen3-shaped decode step term by term: the planner's parts beside measured steps (issue 25).

    .venv/bin/python benchmarks/qwen3_decode_terms.py [--predict-h200]

Measured: (1) the lone graphed server of scripts/device/qwen3_probe.sh on one H100 (lease 3, call 6: its raw
calibration file, step = batch / logged gen throughput, median per point); (2) SGLang's `Decode batch` lines of the
decode server in the `serve` archives of the two Qwen3-shaped runs (two H200s, a GPU per server: call 4; one H100
shared with the prefill: calls 9 and 15), a line's step = running / logged gen throughput (median per running count,
with the lines' median context per request) and AIPerf's ITL p50 at N = 4 and 16 (goodput-ours.json).

Modelled: the decode cost model at that batch and context, split into what a graphed step of a layer shape without a
profile is made of (ForwardTerms._forward_s on the lent floor): attention + dense weights and the LM head at
WEIGHT_READ_EFFICIENCY of datasheet HBM, the routed experts hit under uniform routing (what the Qwen3 routing probe
measured with dummy weights) at the fused-MoE kernel's measured stream share (calibration_lookup.expert_stream_share), the KV read
at WEIGHT_READ_EFFICIENCY over the attention backend's speed relative to the floor's (triton: 1), and the fixed
per-step and per-layer costs lent from the GPU's profiles of other shapes (calibration_lookup.graphed_step_floor). (3) The
stream share's own points: the two H200 R1-shaped profiles that differ only in routing, step difference vs the expert
bytes the two routings read.
"""


from __future__ import annotations

import io
import json
import re
import statistics
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.compressed import read_text  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.perfmodel.server.forward import ATTENTION_BACKEND_SPEED, WEIGHT_READ_EFFICIENCY  # noqa: E402
from orchestrator.perfmodel.weights import experts_hit_fraction  # noqa: E402
from orchestrator.records import Role  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
RUNS = [  # (label, config, gpu, serve archives, goodput json)
    ("H200 x2, a GPU per server", "configs/device-h200x2-qwen3-serve.yaml", "H200",
     ["2026-11-26-two-gpu-lease2-h200x2/call4-pd-serve/serve.tar.xz"], "2026-11-26-two-gpu-lease2-h200x2/goodput-ours.json"),
    ("H100 x1, shared with the prefill", "configs/device-h100x1-qwen3-serve.yaml", "H100-SXM",
     ["2026-11-26-qwen3-serve-one-h100/serve-call9.tar.xz", "2026-11-26-qwen3-serve-one-h100/serve-call15.tar.xz"],
     "2026-11-26-qwen3-serve-one-h100/goodput-ours.json"),
]
BATCHES = (1, 2, 4, 8, 12, 16)
DECODE = re.compile(r"Decode batch, #running-req: (\d+), #token: (\d+).*cuda graph: True, gen throughput \(token/s\): ([\d.]+)")


def logged_steps(archives: list[str]) -> dict[int, list[tuple[float, float]]]:
    """running -> [(step s, context tokens per request)] from the decode servers' graphed `Decode batch` lines."""
    out: dict[int, list[tuple[float, float]]] = {}
    for rel in archives:
        with tarfile.open(RESULTS / rel) as tar:
            for member in tar.getmembers():
                stream = tar.extractfile(member)
                if stream is None or Path(member.name).name != "decode-0-0.log":
                    continue
                for line in io.TextIOWrapper(stream, encoding="utf-8", errors="replace"):
                    m = DECODE.search(line)
                    if m and float(m.group(3)) > 0:
                        running = int(m.group(1))
                        out.setdefault(running, []).append((running / float(m.group(3)), int(m.group(2)) / running))
    return out


LONE = ("benchmarks/results/2026-11-26-two-gpu-lease3-h100x2/call6-qwen3-probe/calibration-qwen3-l6.json.xz",
        "benchmarks/backtest/configs/qwen3-l6-lone.yaml", "H100-SXM")


def model_terms(cfg_path: str, gpu: str, batch: int, context_per_request: float, role: Role = "decode") -> dict[str, float]:
    """The planner's decode step at `batch` and its parts, seconds."""
    cfg = load_config(ROOT / cfg_path, paths_from=ROOT)  # the repository's config: its model folder from ROOT
    _, _, group = next(g for g in cfg.layout.groups() if g[0] in (role, "aggregated"))
    model = cost_model_for(cfg, role, group, gpu=gpu)
    cal, arch, fmt = model.calibration, model.arch, model.format
    assert cal is not None and cal.graph_step_s is not None and cal.graph_layer_s is not None, "no graphed floor lent"
    assert cal.graph_expert_read_share is not None, "no measured expert stream share"
    w = model.weight_bytes_breakdown()
    hbm = model.gpu.hbm_tb_s * 1e12
    rate = hbm * WEIGHT_READ_EFFICIENCY
    uniform = experts_hit_fraction(batch, arch.num_experts_per_tok, arch.n_routed_experts)
    backend = model.attention_speed / ATTENTION_BACKEND_SPEED.get(cal.attention_backend, 1.0)
    kv_s = batch * context_per_request * model.kv_bytes_per_gpu_token() / rate / backend
    return {
        "step": model.decode_step_s(batch, int(batch * context_per_request)),
        "attention+dense": (w["attention"] + w["dense_mlp_shared"]) / rate,
        "experts (uniform)": w["routed_experts"] * uniform / (hbm * cal.graph_expert_read_share),
        "lm head": model.params.lm_head * fmt.embedding_bytes / model.tp / rate,
        "kv": kv_s,
        # Triton GQA attention beyond its bytes (server/triton_gqa.py; 0 before 2026-11-27 hctx)
        "attention wait": model._triton_gqa_wait_s(batch, int(batch * context_per_request), kv_s),
        "step floor": cal.graph_step_s,
        "layer floor": arch.num_hidden_layers * cal.graph_layer_s,
        "experts hit (uniform)": uniform * arch.n_routed_experts,
        "share": cal.graph_expert_read_share,
    }


PARTS = ("attention+dense", "experts (uniform)", "lm head", "kv", "attention wait", "step floor", "layer floor")


def lone_grid() -> None:
    raw, cfg_path, gpu = LONE
    points = json.loads(read_text(ROOT / raw))["runs"][0]["decode"]
    print(f"H100, the lone graphed server ({raw}; conditions {cfg_path}), ms")
    print(f"{'batch':>5} {'ctx':>5} {'measured':>8} {'model':>6} {'error':>7} " + " ".join(f"{p:>17}" for p in PARTS)
          + f" {'measured - model':>16}")
    errors = []
    for p in points:
        t = model_terms(cfg_path, gpu, p["batch_size"], p["context_tokens"], role="aggregated")
        measured, model = p["step_ms_median"], t["step"] * 1e3
        assert abs(sum(t[x] for x in PARTS) - t["step"]) < 1e-6, "the parts do not add up to the step"
        errors.append(abs(model / measured - 1))
        print(f"{p['batch_size']:>5} {p['context_tokens']:>5} {measured:>8.3f} {model:>6.2f} {model / measured - 1:>+7.1%} "
              + " ".join(f"{t[x] * 1e3:>17.2f}" for x in PARTS) + f" {measured - model:>+16.2f}")
    print(f"mean |error| of the model's step over the {len(errors)} grid points: {statistics.mean(errors):.1%}"
          f" (routed experts read at {t['share']:.3f} of datasheet HBM)")
    print()


def stream_share_points() -> None:
    """The points calibration_lookup.expert_stream_share takes the median of (recomputed here the same way, printed)."""
    from dataclasses import replace

    from orchestrator.config.model_presets import MODEL_PRESETS
    from orchestrator.perfmodel.costmodel import build_cost_model
    from orchestrator.perfmodel.profile import shipped_profiles

    pool = shipped_profiles()
    print("the fused-MoE expert stream share: profiles differing only in routing (step difference vs expert bytes)")
    print(f"{'profiles':<60} {'batch':>5} {'ctx':>7} {'GB more':>7} {'ms more':>7} {'share':>6}")
    for real in (p for p in pool if p.model.real_like):
        dummy = next((p for p in pool if not p.model.real_like and p.gpu.name == real.gpu.name
                      and p.model.layer_shape() == real.model.layer_shape()), None)
        arch = next((a for a in MODEL_PRESETS.values() if real.model.matches(a, real.model.quantization)), None)
        if dummy is None or arch is None:
            continue
        m = real.model
        shape = replace(arch, num_hidden_layers=m.num_hidden_layers, first_k_dense_replace=m.first_k_dense_replace)
        model = build_cost_model(shape, real.gpu.name, m.quantization, calibrated=False)
        curve = tuple(sorted((x.tokens, x.distinct_experts) for x in dummy.routing if x.gate == "dummy"))
        steps = {(x.batch_size, x.context_tokens): x.step_s for x in dummy.decode if x.cuda_graph}
        for x in (x for x in real.decode if x.cuda_graph):
            same = steps.get((x.batch_size, x.context_tokens)) or next(
                (s for (b, c), s in sorted(steps.items(), key=lambda kv: abs(kv[0][1] - x.context_tokens))
                 if b == x.batch_size and abs(c - x.context_tokens) <= 0.05 * x.context_tokens), None)
            k, e = arch.num_experts_per_tok, arch.n_routed_experts
            extra = model.weight_bytes_breakdown()["routed_experts"] * (
                experts_hit_fraction(x.batch_size, k, e) - experts_hit_fraction(x.batch_size, k, e, True, curve))
            if same is None or extra <= 0 or x.step_s <= same:
                continue
            share = extra / (x.step_s - same) / (model.gpu.hbm_tb_s * 1e12)
            print(f"{real.name + ' - ' + dummy.name:<60.60} {x.batch_size:>5} {x.context_tokens:>7} {extra / 1e9:>7.2f} "
                  f"{(x.step_s - same) * 1e3:>7.2f} {share:>6.3f}")
    print()


def predict_h200_lone() -> None:
    """The lone grid's conditions on one H200, predicted before any such run: the planner's step (the H200's lent floor)
    beside the step with the H100's per-step part instead (the same die; the hypothesis that the H200 floor's excess
    is its lenders' hosts, docs/fidelity.md hqwen3). A run of this grid decides between the two columns."""
    _, cfg_path, _ = LONE
    print(f"H200, the lone graphed server's grid, predicted ({cfg_path} on H200), ms")
    print(f"{'batch':>5} {'ctx':>5} {'model':>6} {'with H100 step floor':>20}")
    for ctx in (256, 1024, 4096):
        for batch in (1, 4, 8, 16, 32, 64, 128, 256):
            h200 = model_terms(cfg_path, "H200", batch, ctx, role="aggregated")
            h100 = model_terms(cfg_path, "H100-SXM", batch, ctx, role="aggregated")
            alternative = h200["step"] - h200["step floor"] + h100["step floor"]
            print(f"{batch:>5} {ctx:>5} {h200['step'] * 1e3:>6.2f} {alternative * 1e3:>20.2f}")


def main() -> int:
    if "--predict-h200" in sys.argv[1:]:
        predict_h200_lone()
        return 0
    lone_grid()
    for label, cfg_path, gpu, archives, goodput in RUNS:
        steps = logged_steps(archives)
        itl = {r["concurrency"]: r["itl_ms"]["p50"] for r in json.loads((RESULTS / goodput).read_text())["rows"]}
        print(f"{label} ({cfg_path}, {', '.join(archives)}), ms; AIPerf ITL p50 {itl.get(4, float('nan')):.2f} at N = 4, "
              f"{itl.get(16, float('nan')):.2f} at N = 16 ({goodput})")
        print(f"{'batch':>5} {'lines':>5} {'logged':>7} {'ctx/req':>7} {'model':>6} " + " ".join(f"{p:>17}" for p in PARTS))
        for batch in BATCHES:
            seen = steps.get(batch, [])
            if not seen:
                continue
            ctx = statistics.median(c for _, c in seen)
            t = model_terms(cfg_path, gpu, batch, ctx)
            print(f"{batch:>5} {len(seen):>5} {statistics.median(s for s, _ in seen) * 1e3:>7.2f} {ctx:>7,.0f} "
                  f"{t['step'] * 1e3:>6.2f} " + " ".join(f"{t[p] * 1e3:>17.2f}" for p in PARTS)
                  + f"   ({t['experts hit (uniform)']:.0f} of 128 experts hit, uniform)")
        print()
    stream_share_points()
    print("model = the planner's step now: the parts add up to it (max(compute, reads) + floors; no TP collective at TP 1).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
