"""The CPU launch cost of an eager decode step (gpus.GpuSpec eager_launch_*), from every one-GPU eager decode point
the project recorded: an eager step (batch above the largest captured CUDA graph) is launched kernel by kernel from
the scheduler's Python thread, so it lasts max(GPU work, CPU launch), the CPU part being
step + layers x per-layer + requests x per-request. The three are fitted by least squares on the points that are
launch-bound (measured step >= 1.3 x the graph replay's at that batch), over two layer counts (DeepSeek-V2-Lite
27 layers on H100 and H200, the R1 layer shape at 6 layers on H200) so that per-step and per-layer separate; then
each point's residual under max(graphed step, CPU launch) with the shipped constants.

Sources (all one GPU, SGLang 0.5.17, triton attention):
- V2-Lite on H200, PD decode server: the profile's eager points (orchestrator/perfmodel/profiles/
  h200-deepseek-v2-lite-bf16-sglang0.5.17-pd-logs.json, from benchmarks/results/device-h200x2-2026-11-21/);
- V2-Lite on H100, calibration harness (B requests of 256 tokens, 100 steps): benchmarks/results/
  2026-11-24-calibration-h100-v2lite/ (decode-from-main-log.json, calibration-v2lite-ctx.json `beyond`);
- R1 shape x 6 layers on H200, eager servers (--disable-cuda-graph) of the dummy-routing probe: benchmarks/results/
  2026-11-26-dummy-routing-h200/call1/server-{dummy,random}-eager-count.log.xz (their trace hook adds a file write and a
  GPU sync per MoE call, 3 per step).
No TP > 1 point is fitted on: the two-GPU rows (aggregated V2-Lite TP 2) stay out-of-sample. The script then
checks (not fits) the eager steps of the two two-GPU leases of 2026-11-26: the V2-Lite PD decode servers (TP 1) of
benchmarks/results/2026-11-26-two-gpu-h200x2/ calls 4 and 5 and of 2026-11-26-two-gpu-lease2-h200x2/ call 4, the
aggregated V2-Lite TP 2 server of the first lease's call 2, and the R1-shaped TP 2 server without CUDA graphs of the
second lease's call 5 (`tp2-eager`, batch 1-512).

Usage (repo root; no GPU):  .venv/bin/python benchmarks/eager_launch_cost.py
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.compressed import read_text  # noqa: E402
from orchestrator.config.model_presets import DEEPSEEK_R1, DEEPSEEK_V2_LITE  # noqa: E402
from orchestrator.perfmodel.costmodel import build_cost_model  # noqa: E402
from orchestrator.perfmodel.gpus import gpu_spec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
V2_PROFILE = ROOT / "orchestrator/perfmodel/profiles/h200-deepseek-v2-lite-bf16-sglang0.5.17-pd-logs.json"
H100_V2 = RESULTS / "2026-11-24-calibration-h100-v2lite"
R1_EAGER = RESULTS / "2026-11-26-dummy-routing-h200/call1"
LAUNCH_BOUND = 1.3  # a point is launch-bound when its eager step is at least this multiple of the graph replay's
DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+), #token: (\d+).*?cuda graph: (True|False), "
                         r"gen throughput \(token/s\): ([\d.]+)")


def v2lite_model(gpu: str):
    return build_cost_model(DEEPSEEK_V2_LITE, gpu, "bf16", attention_backend="triton", load_format="dummy",
                            context_length=16384, cuda_graph_max_bs=1024, role="decode")


def r1_shaped_model(load_format: str | None):
    shape = replace(DEEPSEEK_R1, num_hidden_layers=6, first_k_dense_replace=3)
    return build_cost_model(shape, "H200", "fp8", attention_backend="triton", load_format=load_format,
                            context_length=16384, cuda_graph_max_bs=1024, mem_fraction_static=0.7)


def eager_log_points(path: Path) -> list[tuple[int, float]]:
    """(batch, median step s) per batch of an eager server's log: running / gen throughput of every line after
    the first at that batch (the first interval holds the batch's prefill)."""
    by_batch: dict[int, list[float]] = {}
    seen: set[int] = set()
    for line in read_text(path, errors="replace").splitlines():
        m = DECODE_LINE.search(line)
        if not m or m.group(3) != "False":
            continue
        running, tput = int(m.group(1)), float(m.group(4))
        if running not in seen:
            seen.add(running)
            continue
        if tput > 0:
            by_batch.setdefault(running, []).append(running / tput)
    return [(b, statistics.median(v)) for b, v in sorted(by_batch.items())]


def points() -> list[dict]:
    """Every one-GPU eager decode point: source, GPU, layers, batch, context per request, measured step, and the
    model's graph replay at that batch (the calibrated step with graphs covering it)."""
    out = []
    profile = json.loads(V2_PROFILE.read_text())
    h200 = v2lite_model("H200")
    for p in profile["decode"]:
        if not p["cuda_graph"]:
            out.append(dict(source="v2lite-h200-pd-decode", gpu="H200", layers=27, batch=p["batch_size"],
                            step_s=p["step_s"], graphed_s=h200.decode_step_s(p["batch_size"], p["context_tokens"])))
    rows = json.loads((H100_V2 / "decode-from-main-log.json").read_text())["rows"]
    ctx_runs = json.loads((H100_V2 / "calibration-v2lite-ctx.json").read_text())["runs"]
    rows += [dict(b, variant="ctx") for r in ctx_runs for b in (r.get("beyond") or []) if b.get("step_ms_median")]
    graphed_h100 = {r["batch_size"]: r["step_ms_median"] / 1e3 for r in rows if r.get("cuda_graph")}
    big = sorted((b, s) for b, s in graphed_h100.items() if b >= 256)
    for r in rows:
        if r["cuda_graph"] or (r.get("variant") == "ctx" and r["batch_size"] == 320):
            continue  # 320 in the ctx run is the first eager shape: its interval holds the kernels' compile
        b = r["batch_size"]
        # the graph replay this harness measured at that batch (384, 512), else the line through its measured
        # replays from 256 up (no V2-Lite profile on H100: the model's step there is an uncalibrated roofline)
        graphed = graphed_h100.get(b) or float(np.polyval(np.polyfit([x for x, _ in big], [y for _, y in big], 1), b))
        out.append(dict(source=f"v2lite-h100-harness-{r['variant']}", gpu="H100-SXM", layers=27, batch=b,
                        step_s=r["step_ms_median"] / 1e3, graphed_s=graphed))
    for name, load_format in (("dummy", "dummy"), ("random", None)):
        model = r1_shaped_model(load_format)
        for b, step in eager_log_points(R1_EAGER / f"server-{name}-eager-count.log.xz"):
            out.append(dict(source=f"r1s6-h200-eager-{name}", gpu="H200", layers=6, batch=b, step_s=step,
                            graphed_s=model.decode_step_s(b, b * 300)))
    return out


LEASE1, LEASE2 = RESULTS / "2026-11-26-two-gpu-h200x2", RESULTS / "2026-11-26-two-gpu-lease2-h200x2"
CHECKS = (  # (label, archive, member, tp)
    ("PD decode TP1 (lease 1 call 4)", LEASE1 / "call4-router/router.tar.xz", "router/decode.log", 1),
    ("PD decode TP1 (lease 1 call 5)", LEASE1 / "call5-pd/pd.tar.xz", "pd/scrape/decode-0-0.log", 1),
    ("PD decode TP1 (lease 2 call 4)", LEASE2 / "call4-pd-serve/pd.tar.xz",
     "pd/scrape/device-h200x2-local-1p1d-set-7b8b71-20261126-125512-4b3d1f/decode-0-0.log", 1),
    ("aggregated TP2 (lease 1 call 2)", LEASE1 / "call2-pd-agg/agg-tp2.tar.xz", "agg-tp2/scrape/aggregated-0-0.log", 2),
)
R1_TP2_EAGER = LEASE2 / "call5-calibration/calibration-twogpu-extra.json.xz"


def log_intervals(text: str) -> list[tuple[int, int, float, bool]]:
    """(running at the line, KV tokens, step s, cuda graph) of every Decode batch line of rank 0 after the first: the
    step is the interval's mean running (this line's and the previous one's) / its gen throughput."""
    out, prev = [], None
    for line in text.splitlines():
        m = DECODE_LINE.search(line)
        if not m or ("TP" in line.split("]")[0] and " TP0]" not in line):
            continue
        running, tokens, graph, tput = int(m.group(1)), int(m.group(2)), m.group(3) == "True", float(m.group(4))
        if prev is not None and tput > 0:
            out.append((running, tokens, (running + prev) / 2 / tput, graph))
        prev = running
    return out


def checks() -> None:
    """Measured eager steps of the two-GPU lease against the model's eager step (not fitted on)."""
    print("\ncheck (not fitted on): eager decode intervals of V2-Lite servers on two two-H200 leases (2026-11-26); "
          "model = the planner's decode_step_s")
    for label, archive, member, tp in CHECKS:
        with tarfile.open(archive) as tar:
            f = tar.extractfile(member)
            assert f is not None
            text = f.read().decode(errors="replace")
        model = build_cost_model(DEEPSEEK_V2_LITE, "H200", "bf16", attention_backend="triton", load_format="dummy",
                                 context_length=16384, role="decode" if tp == 1 else "aggregated", tp=tp,
                                 cuda_graph_max_bs=256)
        rows = [r for r in log_intervals(text) if not r[3] and r[2] < 0.5][1:]  # the first eager interval holds prefill
        errors = []
        for running, tokens, step, _ in rows:
            predicted = model.decode_step_s(running, tokens)
            errors.append(predicted / step - 1)
            print(f"  {label:24s} running {running:4d}: measured {step * 1e3:6.1f} ms, model {predicted * 1e3:6.1f} ms "
                  f"(launch {model.eager_launch_s(running) * 1e3:5.1f}; {errors[-1]:+.0%})")
        if errors:
            print(f"  {label}: mean error {statistics.mean(errors):+.0%} over {len(errors)} intervals")
    raw = json.loads(read_text(R1_TP2_EAGER))
    run = next(r for r in raw["runs"] if r["variant"] == "tp2-eager")
    shape = replace(DEEPSEEK_R1, num_hidden_layers=6, first_k_dense_replace=3)
    model = build_cost_model(shape, "H200", "fp8", attention_backend="triton", load_format="dummy", tp=2,
                             context_length=16384, cuda_graph=False, mem_fraction_static=0.7)
    print(f"\ncheck (not fitted on): R1 shape x 6 layers, TP 2 with --disable-cuda-graph ({R1_TP2_EAGER.relative_to(ROOT)})")
    errors = []
    for p in run["decode"] + (run.get("context") or []):
        b, ctx = p["batch_size"], p["context_tokens"]
        predicted = model.decode_step_s(b, b * (ctx + 50))
        errors.append(predicted * 1e3 / p["step_ms_median"] - 1)
        print(f"  batch {b:3d} x context {ctx:5d}: measured {p['step_ms_median']:5.1f} ms (min {p['step_ms_min']:5.1f}), "
              f"model {predicted * 1e3:5.1f} ms (launch {model.eager_launch_s(b) * 1e3:4.1f}; {errors[-1]:+.0%})")
    print(f"  R1-shaped TP2 eager: mean error {statistics.mean(errors):+.0%} over {len(errors)} points")


def main() -> int:
    pts = points()
    bound = [p for p in pts if p["step_s"] >= LAUNCH_BOUND * p["graphed_s"]]
    x = np.array([[1.0, p["layers"], p["batch"]] for p in bound])
    y = np.array([p["step_s"] for p in bound])
    w = 1 / y  # relative errors
    (c_step, c_layer, c_req), *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    print(f"{len(pts)} one-GPU eager decode points, {len(bound)} launch-bound (step >= {LAUNCH_BOUND} x graph replay)")
    print(f"fit: step {c_step * 1e3:.2f} ms + {c_layer * 1e3:.3f} ms per layer + {c_req * 1e6:.1f} us per request")
    spec = gpu_spec("H200")
    shipped = (spec.eager_launch_step_s, spec.eager_launch_layer_s, spec.eager_launch_per_request_s)
    print(f"shipped (gpus.GpuSpec): step {shipped[0] * 1e3:.2f} ms + {shipped[1] * 1e3:.3f} ms per layer + "
          f"{shipped[2] * 1e6:.1f} us per request")
    errors, old_errors = [], []
    for p in pts:
        cpu = shipped[0] + p["layers"] * shipped[1] + p["batch"] * shipped[2]
        model_s = max(p["graphed_s"], cpu)
        old_s = p["graphed_s"] + p["layers"] * 0.65e-3  # the former additive eager cost (0.65 ms per layer)
        errors.append(model_s / p["step_s"] - 1)
        old_errors.append(old_s / p["step_s"] - 1)
        tag = "launch-bound" if p in bound else "gpu-bound"
        print(f"  {p['source']:32s} {p['gpu']:8s} L={p['layers']:2d} B={p['batch']:4d}: measured {p['step_s'] * 1e3:6.1f} ms, "
              f"graph replay {p['graphed_s'] * 1e3:5.1f}, CPU launch {cpu * 1e3:5.1f} -> {model_s * 1e3:5.1f} ms "
              f"({errors[-1]:+.1%}; additive 0.65 ms/layer {old_errors[-1]:+.1%}) [{tag}]")
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    old_rms = math.sqrt(sum(e * e for e in old_errors) / len(old_errors))
    print(f"RMS over all {len(pts)} points: launch-bound max() {rms:.1%}; former additive {old_rms:.1%}")
    checks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
