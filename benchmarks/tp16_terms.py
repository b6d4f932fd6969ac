"""The TP16 rows of the back-test, term by term: where the planner's run of each goes (prefill forwards, graphed and
eager decode steps, their counts and seconds), and one graphed and one eager decode step split into its terms
(weight and expert reads, KV read, all-reduces, fixed costs, CPU launch). Nothing is fitted; it reads the model.

Run from the repo root (virtual time, seconds of CPU):
  python3 benchmarks/manifest.py record --out benchmarks/results/<date>-tp16-terms -- .venv/bin/python benchmarks/tp16_terms.py
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.config import load_config
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.plan.backtest.dataset import DATASET, build_batch, load_dataset
from orchestrator.plan.simulation.simulate import simulate_run

ROOT = Path(__file__).resolve().parents[1]


def step_terms(m, bs: int, ctx: float) -> str:
    """One decode step of `bs` requests over `ctx` context tokens on the roofline path, by term (ms)."""
    hbm = m.gpu.hbm_tb_s * 1e12
    weights, routed = m._weight_bytes_read(bs)
    routed_share = getattr(m.gpu, "routed_read_share", None) or m.efficiency_decode  # before its field: all reads at one share
    layers = m.arch.num_hidden_layers
    eager = m.decode_runs_eager(bs)
    terms = {
        "weights (non-expert)": (weights - routed) / (hbm * m.efficiency_decode),
        "routed experts": routed / (hbm * routed_share),
        "KV": ctx * m.kv_bytes_per_gpu_token() / (hbm * m.efficiency_decode),
        f"{2 * layers} all-reduces (+ cross-node layer cost)": m._comm_s(bs, eager=eager, decode=True),
        "fixed (step + layers)": m.gpu.step_overhead_s + layers * m.gpu.layer_overhead_s,
    }
    parts = ", ".join(f"{k} {v * 1e3:.2f}" for k, v in terms.items())
    launch = f", CPU launch {m.eager_launch_s(bs) * 1e3:.1f}" if eager else ""
    return f"bs {bs:4d} {'eager ' if eager else 'graph '} step {m.decode_step_s(bs, ctx) * 1e3:6.2f} ms = max(GPU, launch): {parts}{launch}"


def main() -> None:
    data = load_dataset()
    rows = [r for r in data["runs"] if r["kind"] == "throughput" and "tp16" in r["id"]]
    batches = data["batches"]
    for row in rows:
        cfg = load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
        batch = build_batch(batches[row["batch"]], DATASET.parent)
        role, _, group = cfg.layout.groups()[0]
        m = cost_model_for(cfg, role, group, sglang_version=row.get("sglang_version"))
        acc = {"prefill": [0, 0.0, 0], "graphed decode": [0, 0.0, 0], "eager decode": [0, 0.0, 0]}

        def observe(now, server, forward, schedule, acc=acc, m=m) -> None:
            if forward.kind == "prefill":
                key, size = "prefill", sum(t for _, t in forward.prefill)
            else:
                size = len(forward.running)
                key = "eager decode" if m.decode_runs_eager(size) else "graphed decode"
            acc[key][0] += 1
            acc[key][1] += forward.duration_s
            acc[key][2] += size

        run = simulate_run(cfg, batch, max_concurrency=None, sglang_version=row.get("sglang_version"), observe=observe)
        meas = row["measured"]
        print(f"== {row['id']} (SGLang {row.get('sglang_version') or cfg.engine.sglang.version}, GPU {cfg.cluster.gpu}): "
              f"measured {meas['duration_s']:.1f} s / {meas['total_tok_s']:,} tok/s; model {run.duration_s:.1f} s, "
              f"CUDA graphs to batch {max(m.graph_batch_sizes())}")
        for key, (n, s, size) in acc.items():
            if n:
                unit = "tokens" if key == "prefill" else "requests"
                print(f"   {key:15s} {n:6d} forwards, {s:7.2f} s, mean {s / n * 1e3:7.2f} ms, mean {size / n:8.1f} {unit}")
        if acc["prefill"][0]:
            fixed = m.gpu.step_overhead_s + m.arch.num_hidden_layers * m.gpu.layer_overhead_s
            print(f"   fixed cost in the prefill forwards: {acc['prefill'][0]} x {fixed * 1e3:.2f} ms = {acc['prefill'][0] * fixed:.2f} s")
        for bs in (64, 160, 512, 1024):
            print("   " + step_terms(m, bs, bs * 800.0))


if __name__ == "__main__":
    main()
