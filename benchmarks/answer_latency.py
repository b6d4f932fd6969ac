"""What a lone short prompt's ~20 ms answer is made of, and the per-request answer latency the planner adds to what a
client sees (gpus.GpuSpec.answer_latency_s), from the calibration harness's client latencies.

A lone prompt with max_new_tokens=1 answers after: the request path in (HTTP, SGLang's tokenizer manager, a ZMQ hop to
the scheduler), one prefill forward, and the path out (the scheduler's result processing one loop iteration later,
a ZMQ hop to the detokenizer and one back, the HTTP answer, the client). SGLang 0.5.17 captures no prefill CUDA graph
by default, so that forward is launched kernel by kernel from the scheduler's thread, like an eager decode step, and
lasts max(GPU work, CPU launch) (the launch constants of gpus.GpuSpec, fitted on eager decode points by
benchmarks/eager_launch_cost.py). What the model of that forward leaves of a lone prompt's client latency is the
request path: the answer latency.

- Measured on (in-sample): the lone prompts (k = 1) whose modelled forward is launch-bound, in the two one-GPU
  calibration files whose eager steps set the launch constants or whose profile ships:
  2026-11-24-calibration-h100-r1shaped (R1 layer shape, 6 layers, FP8; h100-r1-shaped profile) and
  2026-11-24-calibration-h100-v2lite (V2-Lite, 27 layers, bf16; its eager points are in the launch fit).
  The answer latency is the median of (client latency - modelled forward) over them.
- Checked (not fitted): the lone prompts of the three two-H200 servers (TP 2, PP 2, DP-attention 2 + EP 2), the k
  prompts at once of every file, and each file's batch-1 decode point (100 output tokens: the answer latency +
  one prefill + 99 steps at the measured step).

Both files ran the harness with --skip-tokenizer-init (token ids in and out: no tokenisation or detokenisation of
text), over a new loopback HTTP connection per request (orchestrator/calibrate/client.py).

Usage (repo root; no GPU):  .venv/bin/python benchmarks/answer_latency.py
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.compressed import read_text  # noqa: E402
from orchestrator.config.model_presets import DEEPSEEK_R1, DEEPSEEK_V2_LITE  # noqa: E402
from orchestrator.perfmodel.costmodel import EngineCostModel, build_cost_model  # noqa: E402
from orchestrator.perfmodel.gpus import gpu_spec  # noqa: E402
from orchestrator.perfmodel.scheduling.limits import server_limits  # noqa: E402
from orchestrator.perfmodel.scheduling.steps import burst_prefill  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
R1_SHAPE = replace(DEEPSEEK_R1, num_hidden_layers=6, first_k_dense_replace=3)


def _r1(gpu: str, **server) -> EngineCostModel:
    return build_cost_model(R1_SHAPE, gpu, "fp8", attention_backend="triton", load_format="dummy",
                            context_length=16384, **server)


# (label, raw file, run variant, cost model of that server, in-sample)
SERVERS = (
    ("H100 R1 shape x6, TP 1", RESULTS / "2026-11-24-calibration-h100-r1shaped/calibration-r1s6.json.xz", "cold-default",
     lambda: _r1("H100-SXM"), True),
    ("H100 V2-Lite x27, TP 1", RESULTS / "2026-11-24-calibration-h100-v2lite/calibration-v2lite.json", "cold-default",
     lambda: build_cost_model(DEEPSEEK_V2_LITE, "H100-SXM", "bf16", attention_backend="triton", load_format="dummy",
                              context_length=16384), True),
    ("2xH200 R1 shape x6, TP 2", RESULTS / "2026-11-26-two-gpu-tp2-h200x2/calibration-twogpu-tp2.json.xz", "tp2",
     lambda: _r1("H200", tp=2, mem_fraction_static=0.7, cuda_graph_max_bs=512), False),
    ("2xH200 R1 shape x6, PP 2", RESULTS / "2026-11-26-two-gpu-h200x2/call1-calibration/calibration-twogpu.json.xz", "pp2",
     lambda: _r1("H200", pp=2, mem_fraction_static=0.7, cuda_graph_max_bs=512), False),
    ("2xH200 R1 shape x6, DP-attn 2 + EP 2", RESULTS / "2026-11-26-two-gpu-h200x2/call3-calibration/calibration-twogpu-b.json.xz",
     "dpattn2-ep2", lambda: _r1("H200", tp=2, dp=2, ep=2, dp_attention=True, mem_fraction_static=0.7,
                                cuda_graph_max_bs=512), False),
)


@functools.cache
def _model(label: str) -> EngineCostModel:
    """The cost model of SERVERS' server `label`, built once for every table that reads it."""
    return next(build for name, _, _, build, _ in SERVERS if name == label)()


def _run(path: Path, variant: str) -> dict:
    return next(r for r in json.loads(read_text(path))["runs"] if r["variant"] == variant)


def forward_parts(model: EngineCostModel, prompt: int) -> tuple[float, float]:
    """(the modelled forward of one lone prompt on an idle server, the CPU launch of its first chunk) in seconds, as
    the step loop times it (scheduling/steps.py burst_prefill: its chunks, per DP-attention rank, the first one never
    shorter than its launch)."""
    forwards = burst_prefill(server_limits(model), model, [prompt])
    return sum(f.duration_s for f in forwards), model.prefill_launch_s(1) or model.eager_launch_s(1, stage=model.pp - 1, decode=False)


def lone_points(label: str, path: Path, variant: str, model: EngineCostModel) -> list[dict]:
    out = []
    for p in _run(path, variant).get("prefill") or []:
        if p["concurrency"] != 1:
            continue
        forward, launch = forward_parts(model, p["input_tokens"])
        out.append(dict(server=label, prompt=p["input_tokens"], measured_s=p["latency_s_median"], forward_s=forward,
                        launch_bound=launch >= forward - 1e-12, residual_s=p["latency_s_median"] - forward))
    return out


def answer_latency_s() -> tuple[float, list[dict]]:
    """The median residual over the in-sample launch-bound lone prompts, and those points."""
    points = [pt for label, path, variant, _, in_sample in SERVERS if in_sample
              for pt in lone_points(label, path, variant, _model(label)) if pt["launch_bound"]]
    return statistics.median(pt["residual_s"] for pt in points), points


def main() -> int:
    answer, used = answer_latency_s()
    print("A lone prompt (max_new_tokens 1): client latency = answer latency + one prefill forward, the forward")
    print("= max(GPU work, CPU launch) (prefill is eager in SGLang 0.5.17). ms, median of 3 after a first.\n")
    print("measured on (in-sample, launch-bound lone prompts):")
    for pt in used:
        print(f"  {pt['server']:36s} L={pt['prompt']:5d}: client {pt['measured_s'] * 1e3:6.1f}, modelled forward "
              f"{pt['forward_s'] * 1e3:5.1f} -> residual {pt['residual_s'] * 1e3:5.1f}")
    shipped = gpu_spec("H200").answer_latency_s
    print(f"answer latency = median residual {answer * 1e3:.2f} ms over {len(used)} points "
          f"(range {min(p['residual_s'] for p in used) * 1e3:.1f}-{max(p['residual_s'] for p in used) * 1e3:.1f}); "
          f"shipped gpus.GpuSpec.answer_latency_s {shipped * 1e3:.2f} ms\n")
    print("every lone prompt: client vs answer latency + modelled forward (launch-bound forwards marked *):")
    for label, path, variant, _, in_sample in SERVERS:
        model = _model(label)
        launch = model.eager_launch_s(1, stage=model.pp - 1 if model.pp > 1 else None, decode=False)
        print(f"  {label} ({'in-sample' if in_sample else 'check, not fitted'}; CPU launch of one forward "
              f"{launch * 1e3:.1f} ms{', one stage' if model.pp > 1 else ''})")
        for pt in lone_points(label, path, variant, model):
            predicted = shipped + pt["forward_s"]
            print(f"    L={pt['prompt']:5d}: client {pt['measured_s'] * 1e3:7.1f}, model {predicted * 1e3:7.1f} "
                  f"({pt['forward_s'] * 1e3:6.1f}{'*' if pt['launch_bound'] else ' '} + {shipped * 1e3:.1f}; "
                  f"{pt['measured_s'] / predicted - 1:+.0%} measured vs model)")
    print("\nbatch-1 decode points (100 output tokens): client - 99 x measured step = answer + prefill + first step's extra")
    for label, path, variant, _, _ in SERVERS:
        model = _model(label)
        for p in _run(path, variant).get("decode") or []:
            if p.get("batch_size") != 1 or not p.get("client"):
                continue
            rest = p["client"]["latency_s_median"] * 1e3 - (p["decode_steps"] - 1) * p["step_ms_median"]
            forward, _ = forward_parts(model, p["context_tokens"])
            print(f"  {label:36s} step {p['step_ms_median']:5.2f} ms: residual {rest:5.1f} ms, model answer + "
                  f"prefill {(shipped + forward) * 1e3:5.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
