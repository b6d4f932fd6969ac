"""The Qwen3-shaped decode step term by term: the planner's parts beside the decode server's logged steps (issue 25).

    .venv/bin/python benchmarks/qwen3_decode_terms.py

Measured: SGLang's `Decode batch` lines of the decode server in the `serve` archives of the two Qwen3-shaped runs
(two H200s, a GPU per server: call 4; one H100 shared with the prefill: calls 9 and 15). A line's step is running /
logged gen throughput, an interval per step over the lines' logging period (it holds any gap between steps), as in
every earlier table; median per running count, with the lines' median context per request (#token / running) and
AIPerf's ITL p50 at N = 4 and 16 (goodput-ours.json).

Modelled: the decode cost model of configs/device-h{200x2,100x1}-qwen3-serve.yaml at that batch and context, split
into what a graphed step of a layer shape without a profile is made of (timing._forward_s, graphed floor): weight reads
at WEIGHT_READ_EFFICIENCY of datasheet HBM (attention + dense, the routed experts hit under uniform routing as the
planner prices dummy weights on this shape today, the LM head), the KV read, the fixed per-step and per-layer costs
lent from the GPU's profiles of other shapes (costmodel.graphed_step_floor), all divided by the attention backend's
speed; beside it the routed experts a step reads if every token picks the same top_k (the routing hypothesis, which
hqprobe's probe decides; not applied here).
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

from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.perfmodel.timing import WEIGHT_READ_EFFICIENCY  # noqa: E402
from orchestrator.perfmodel.weights import experts_hit_fraction  # noqa: E402

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


def model_terms(cfg_path: str, gpu: str, batch: int, context_per_request: float) -> dict[str, float]:
    """The planner's decode step at `batch` and its parts, seconds."""
    cfg = load_config(ROOT / cfg_path)
    _, _, group = next(g for g in cfg.layout.groups() if g[0] == "decode")
    model = cost_model_for(cfg, "decode", group, gpu=gpu)
    cal, arch, fmt = model.calibration, model.arch, model.format
    assert cal is not None and cal.graph_step_s is not None and cal.graph_layer_s is not None, "no graphed floor lent"
    w = model.weight_bytes_breakdown()
    rate = model.gpu.hbm_tb_s * 1e12 * WEIGHT_READ_EFFICIENCY
    uniform = experts_hit_fraction(batch, arch.num_experts_per_tok, arch.n_routed_experts)
    speed = model.attention_speed
    return {
        "step": model.decode_step_s(batch, int(batch * context_per_request)),
        "attention+dense": (w["attention"] + w["dense_mlp_shared"]) / rate / speed,
        "experts (uniform)": w["routed_experts"] * uniform / rate / speed,
        "lm head": model.params.lm_head * fmt.embedding_bytes / model.tp / rate / speed,
        "kv": batch * context_per_request * model.kv_bytes_per_gpu_token() / rate / speed,
        "step floor": cal.graph_step_s / speed,
        "layer floor": arch.num_hidden_layers * cal.graph_layer_s / speed,
        "experts (top_k)": w["routed_experts"] * arch.num_experts_per_tok / arch.n_routed_experts / rate / speed,
        "experts hit (uniform)": uniform * arch.n_routed_experts,
    }


def main() -> int:
    parts = ("attention+dense", "experts (uniform)", "lm head", "kv", "step floor", "layer floor")
    for label, cfg_path, gpu, archives, goodput in RUNS:
        steps = logged_steps(archives)
        itl = {r["concurrency"]: r["itl_ms"]["p50"] for r in json.loads((RESULTS / goodput).read_text())["rows"]}
        print(f"{label} ({cfg_path}, {', '.join(archives)}), ms; AIPerf ITL p50 {itl.get(4, float('nan')):.2f} at N = 4, "
              f"{itl.get(16, float('nan')):.2f} at N = 16 ({goodput})")
        print(f"{'batch':>5} {'lines':>5} {'logged':>7} {'ctx/req':>7} {'model':>6} " + " ".join(f"{p:>17}" for p in parts)
              + f" {'experts (top_k)':>15} {'model, top_k':>12}")
        for batch in BATCHES:
            seen = steps.get(batch, [])
            if not seen:
                continue
            ctx = statistics.median(c for _, c in seen)
            t = model_terms(cfg_path, gpu, batch, ctx)
            top_k = t["step"] - t["experts (uniform)"] + t["experts (top_k)"]
            print(f"{batch:>5} {len(seen):>5} {statistics.median(s for s, _ in seen) * 1e3:>7.2f} {ctx:>7,.0f} "
                  f"{t['step'] * 1e3:>6.2f} " + " ".join(f"{t[p] * 1e3:>17.2f}" for p in parts)
                  + f" {t['experts (top_k)'] * 1e3:>15.2f} {top_k * 1e3:>12.2f}"
                  + f"   ({t['experts hit (uniform)']:.0f} of 128 experts hit, uniform)")
        print()
    print("model = the planner's step now (parts: max(compute, reads) + floors, / the triton backend's speed 0.94);")
    print("model, top_k = the same with the routed experts read as top_k per layer (the routing hypothesis, not applied).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
