"""The organisers' 94-layer Qwen3 decode step term by term, as the planner prices it (issue 25).

    .venv/bin/python benchmarks/qwen3_94layer_terms.py [--gpu H100-SXM]

Their decode worker (configs/qwen3-pd-2026.yaml, `layout.decode.0`: TP 4 x EP 4, 94 layers, H100, FA3, BF16 KV, the
published FP8 checkpoint) has no calibration profile: its graphed step is the roofline plus this layer shape's own
floor (calibration_lookup.lent_floor_split: the Qwen3-shaped layer-count profiles of this GPU's host). This prints
that step's parts, which add up to `decode_step_s` (asserted):
- fixed per step and fixed per layer x 94 (the floor split from the 6- and 12-layer counts);
- weights read: attention + router (every layer, this GPU's TP share), the routed experts the batch hits (uniform
  routing over 128, top 8; EP 4: this GPU's 32), the LM head, each at its read rate;
- KV read (the batch's context, this GPU's KV heads, over the attention backend's speed relative to the floor's);
- the step's compute at the assumed share of peak (it enters only as max(compute, reads): shown, with which binds);
- TP all-reduces: two per layer, split into NCCL latency and bytes; all-to-all: none (SGLang 0.5.17 with --ep-size 4
  and the default --moe-a2a-backend none keeps every token on every rank and sums the experts by the TP all-reduce).
Rows: (1) the organisers' N = 24 / 32 / 48 / 64 at the planner's own time-average decode batch of a decode server
(router.policy=random, as the back-test rows run) beside their ITL p50; (2) their own decode steps at N = 32: SGLang's
`Decode batch` lines of decode-0 copied from their published log (the warm-up's in
benchmarks/results/2026-11-27-organisers-n32-waves/, the measured phase's next to this script's output; only N = 32's
decode logs are published):
between two consecutive lines with no request in KV transfer nobody joins, so the interval's mean batch is about the
two lines' mean #running-req and its step that batch / the logged gen throughput; beside the model's step at that batch
(context 4,100 per request: the lines' #token / #running-req is 4,076-4,104); (3) a grid of batch x context for a
measurement of the same step (dummy weights: the Qwen3 router stays uniform with random-id prompts,
benchmarks/results/2026-11-26-two-gpu-lease3-h100x2/call6-qwen3-probe/routing.json; prompts that all end in one token
route as two tokens instead, weights.decode_routing_tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.perfmodel.parallel import collectives  # noqa: E402
from orchestrator.perfmodel.server.forward import ATTENTION_BACKEND_SPEED, WEIGHT_READ_EFFICIENCY  # noqa: E402
from orchestrator.plan.closedloop.client import ClosedLoopLoad, simulate_closed_loop  # noqa: E402

CONFIG = "configs/qwen3-pd-2026.yaml"
ORGANISERS_N32 = (  # decode-0's lines of the warm-up (hqwen2) and of the measured phase (hqbatch), copied by hand
    ROOT / "benchmarks/results/2026-11-27-organisers-n32-waves/organisers-n32-log-lines.json",
    ROOT / "benchmarks/results/2026-11-27-qwen3-94layer-terms/organisers-n32-decode0-measured-lines.json",
)
CONTEXT_PER_REQUEST = 4100  # ISL 4,000 + half of OSL 200
SETS = ["router.policy=random"]  # the organisers' rows' override (benchmarks/backtest/closed_loop.yaml)
# the organisers' published ITL p50, ms (benchmarks/backtest/closed_loop.yaml rows organisers-h100-reference-n*)
MEASURED_ITL_MS = {24: 17.831, 32: 18.956, 48: 20.360, 64: 21.265}
PARTS = ("fixed per step", "fixed per layer x L", "attention+router read", "experts read", "lm head read", "kv read",
         "all-reduce latency", "all-reduce bytes", "all-to-all")


def decode_model(gpu: str, load_format: str | None = None):
    sets = [*SETS, f"cluster.gpu={gpu}"] + ([f"engine.sglang.load_format={load_format}"] if load_format else [])
    cfg = load_config(ROOT / CONFIG, sets, paths_from=ROOT)
    _, _, group = next(g for g in cfg.layout.groups() if g[0] == "decode")
    return cfg, cost_model_for(cfg, "decode", group)


def terms(model, batch: int, context_tokens: int) -> dict[str, float]:
    """The graphed step at `batch` requests over `context_tokens` (summed) as server/forward.py's _forward_s prices a
    layer shape with a lent floor, in seconds; 'step' is the model's own decode_step_s."""
    cal, arch, p = model.calibration, model.arch, model.params
    assert cal is not None and model._lent_floor and not model._tp_spans_nodes and model.pp == 1 and model.speculative is None
    assert not model.decode_runs_eager(batch), f"batch {batch} runs eagerly: not this path"
    hbm = model.gpu.hbm_tb_s * 1e12
    weights, routed = model._weight_bytes_read(batch)
    lm_head = p.lm_head * model.format.embedding_bytes / model.tp
    backend = model.attention_speed / ATTENTION_BACKEND_SPEED.get(cal.attention_backend, 1.0)
    kv_bytes = context_tokens * model.kv_bytes_per_gpu_token() / model.attn_dp
    reads = {
        "attention+router read": (weights - routed - lm_head) / (hbm * WEIGHT_READ_EFFICIENCY),
        "experts read": routed / (hbm * (cal.graph_expert_read_share or WEIGHT_READ_EFFICIENCY)),
        "lm head read": lm_head / (hbm * WEIGHT_READ_EFFICIENCY),
        "kv read": kv_bytes / backend / (hbm * WEIGHT_READ_EFFICIENCY),
    }
    active = p.attention + p.dense_mlp + p.shared_experts + p.router
    routed_active = batch * arch.num_experts_per_tok * arch.moe_layers * p.one_expert_per_layer
    ctx_flops = 2 * arch.num_attention_heads * (arch.qk_head_dim + arch.value_head_dim) * arch.num_hidden_layers * context_tokens
    flops = 2 * (batch * active + routed_active + batch * p.lm_head) + ctx_flops
    compute = flops / (model.tp * model._peak_flops() * model.efficiency_prefill)
    links = collectives.link_figures(model.gpu, model.comm_efficiency)
    allreduces = 2 * arch.num_hidden_layers if model.tp > 1 else 0
    message = batch * arch.hidden_size * 2
    comm = model._comm_s(batch, decode=True)
    latency = allreduces * links.intra_latency_s
    out = {
        "fixed per step": cal.graph_step_s,
        "fixed per layer x L": arch.num_hidden_layers * cal.graph_layer_s,
        **reads,
        "all-reduce latency": latency,
        "all-reduce bytes": comm - latency,
        "all-to-all": 0.0,
        "compute": compute,
        "experts hit": model._experts_hit_fraction(batch) * arch.n_routed_experts,
        "allreduces": allreduces,
        "message bytes": message,
    }
    memory = sum(reads.values())
    if compute > memory:  # the roofline's max: compute binds, the reads are hidden under it
        out["compute over reads"] = compute - memory
    out["step"] = model.decode_step_s(batch, context_tokens)
    added = sum(out[k] for k in PARTS) + out.get("compute over reads", 0.0)
    assert abs(added - out["step"]) < 1e-9, f"the parts {added} do not add up to the step {out['step']}"
    return out


def planner_batches(cfg, gpu: str) -> dict[int, tuple[float, float, float]]:
    """N -> (time-average decode batch of one decode server, its mean context per request, ITL p50 ms) in the planner's
    closed loop of the organisers' rows."""
    out = {}
    for n in MEASURED_ITL_MS:
        load = ClosedLoopLoad.of(cfg, n)
        busy: dict[str, float] = defaultdict(float)

        def observe(now, server, forward, _schedule, load=load, busy=busy):
            if server.startswith("decode") and forward.kind == "decode" and now < load.window_s:
                busy["s"] += forward.duration_s
                busy["req_s"] += forward.duration_s * len(forward.running)

        run = simulate_closed_loop(cfg, load, gpu=gpu, observe=observe)
        out[n] = (busy["req_s"] / busy["s"], cfg.benchmark.input_tokens + cfg.benchmark.output_tokens / 2,
                  run.itl_ms()["p50"])
    return out


def logged_steps() -> list[tuple[str, float, float]]:
    """(interval, mean running batch, seconds per step) of decode-0's intervals at N = 32 with nobody in KV transfer at
    either end (no request joins inside one)."""
    out = []
    for path in ORGANISERS_N32:
        lines = json.loads(path.read_text())["decode_lines"]
        for (t0, run0, transfer0, _), (t1, run1, transfer1, throughput) in zip(lines, lines[1:]):
            if transfer0 == 0 and transfer1 == 0 and throughput > 0:
                batch = (run0 + run1) / 2
                out.append((f"{t0}-{t1} {run0}->{run1}", batch, batch / throughput))
    return out


def step_at(model, batch: float, context_per_request: int) -> float:
    """The model's step at a fractional mean batch: linear between the two whole batches around it."""
    lo = int(batch)
    steps = [model.decode_step_s(b, b * context_per_request) for b in (lo, lo + 1)]
    return steps[0] + (batch - lo) * (steps[1] - steps[0])


def table(model, rows: list[tuple[str, int, int]], measured: dict[str, float] | None = None) -> None:
    head = f"{'row':>14} {'batch':>5} {'ctx/req':>7} {'step':>7} " + " ".join(f"{p:>{max(8, len(p))}}" for p in PARTS)
    print(head + f" {'compute':>8} {'binds':>7} {'experts':>7}" + (f" {'measured ITL':>12} {'excess':>7}" if measured else ""))
    for label, batch, ctx in rows:
        t = terms(model, batch, batch * ctx)
        line = (f"{label:>14} {batch:>5} {ctx:>7,} {t['step'] * 1e3:>7.2f} "
                + " ".join(f"{t[p] * 1e3:>{max(8, len(p))}.3f}" for p in PARTS)
                + f" {t['compute'] * 1e3:>8.3f} {'compute' if 'compute over reads' in t else 'reads':>7} {t['experts hit']:>7.1f}")
        if measured and label in measured:
            line += f" {measured[label]:>12.2f} {t['step'] * 1e3 - measured[label]:>+7.2f}"
        print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="H100-SXM")
    args = parser.parse_args(argv)
    cfg, model = decode_model(args.gpu)
    cal, arch = model.calibration, model.arch
    assert cal is not None
    links = collectives.link_figures(model.gpu, model.comm_efficiency)
    print(f"{CONFIG} layout.decode.0 on {args.gpu}: TP {model.tp} x EP {model.ep}, {arch.num_hidden_layers} layers, "
          f"attention {model.attention_backend or 'fa3'}, KV {model.kv_dtype_bytes} B/element, load_format {model.load_format}")
    print(f"  floor: {cal.graph_step_s * 1e3:.3f} ms per step + {cal.graph_layer_s * 1e6:.1f} us per layer "
          f"(counts {list(cal.floor_counts)} of this shape on this GPU's host: calibration_lookup.lent_floor_split)")
    print(f"  reads at {WEIGHT_READ_EFFICIENCY:.0%} of {model.gpu.hbm_tb_s} TB/s, routed experts at "
          f"{cal.graph_expert_read_share:.3f} (calibration_lookup.expert_stream_share); KV over the backend's speed "
          f"{model.attention_speed / ATTENTION_BACKEND_SPEED.get(cal.attention_backend, 1.0):.3f} (fa3 vs the floor's "
          f"{cal.attention_backend}); compute at {model.efficiency_prefill:.0%} of peak (engine.sim.efficiency_prefill)")
    print(f"  all-reduce: {links.intra_latency_s * 1e6:.1f} us + 2(n-1)/n x bytes / {links.intra_allreduce_busbw / 1e9:.0f} GB/s "
          f"(collectives.HOPPER, NCCL ring inside a node), 2 per layer; all-to-all: none (see the docstring)")
    print(f"  KV bytes per token on one GPU: {model.kv_bytes_per_gpu_token():,.0f} (all {arch.num_hidden_layers} layers)")
    print()
    print("1. The organisers' rows at the planner's time-average decode batch of one decode server (ms)")
    batches = planner_batches(cfg, args.gpu)
    rows, measured = [], {}
    for n, (batch, ctx, itl) in batches.items():
        label = f"N={n}"
        rows.append((label, round(batch), int(ctx)))
        measured[label] = MEASURED_ITL_MS[n]
        print(f"  N = {n}: time-average decode batch {batch:.2f}, context {ctx:,.0f} per request, planner ITL p50 "
              f"{itl:.2f} ms, measured {MEASURED_ITL_MS[n]:.2f} ms")
    table(model, rows, measured)
    print()
    print("2. The organisers' own decode steps at N = 32 (" + ", ".join(str(p.relative_to(ROOT)) for p in ORGANISERS_N32) + "), ms")
    print(f"{'interval, #running-req':>34} {'mean batch':>10} {'logged step':>11} {'model step':>10} {'model - logged':>14}")
    logged = logged_steps()
    for label, batch, step in logged:
        model_step = step_at(model, batch, CONTEXT_PER_REQUEST)
        print(f"{label:>34} {batch:>10.1f} {step * 1e3:>11.2f} {model_step * 1e3:>10.2f} {(model_step - step) * 1e3:>+14.2f}")
    xs, ys = [b for _, b, _ in logged], [s * 1e3 for _, _, s in logged]
    slope, intercept = statistics.linear_regression(xs, ys)
    model_ys = [step_at(model, b, CONTEXT_PER_REQUEST) * 1e3 for b in xs]
    model_slope, model_intercept = statistics.linear_regression(xs, model_ys)
    print(f"  {len(logged)} intervals, batch {min(xs):.1f}-{max(xs):.1f}: logged step {intercept:.2f} ms + {slope:.3f} ms per "
          f"request (least squares, descriptive only); the model over the same batches {model_intercept:.2f} ms + "
          f"{model_slope:.3f} ms per request; median model - logged {statistics.median(m - y for m, y in zip(model_ys, ys)):+.2f} ms")
    print()
    print("3. The same step over batch and context (a measurement of it: dummy weights route uniformly too), ms")
    grid = [(f"b{b} c{c}", b, c) for c in (256, 4096) for b in (1, 4, 8, 16, 24, 32, 48, 64)]
    table(model, grid)
    print()
    print("step = fixed + reads (or compute where it binds) + all-reduces; 'excess' = the planner's step at that batch "
          "- the measured ITL p50 (ITL also holds what a step does not: the loop's own gaps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
