"""The four published 2 x 8 H100 TP16 rows (SGLang defaults, batch caps 1024, caps at mem 0.80 / 0.88), each prediction
split into its terms: what the row gives the model (flags resolved, KV pool), where the run's seconds go (prefill
forwards, decode steps, the start before the first decode step and the tail after the last prefill), and every forward's
seconds summed by term: weight and expert reads, KV read, the all-reduces' latency (NCCL's alpha over IB: a TP group
across two nodes runs every all-reduce at the inter-node figures, NVLink inside it included) and bandwidth, the cited
cross-node layer cost, the GPU's fixed costs, an eager step's CPU launch beyond its GPU work, the rest (compute or the
max() of the roofline). Nothing is fitted; it reads the model and the back-test dataset.

Run from the repo root (virtual time, seconds of CPU):
  python3 benchmarks/manifest.py record --out benchmarks/results/<date>-tp16-caps-terms -- \
      .venv/bin/python benchmarks/tp16_caps_terms.py
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from pathlib import Path

from orchestrator.config import load_config
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.parallel import collectives
from orchestrator.plan.backtest.dataset import DATASET, load_dataset, sent_batch
from orchestrator.plan.simulation.simulate import simulate_run

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("h100x16-r1-tp16-sglang-defaults", "h100x16-r1-tp16-batch-caps-1024", "h100x16-r1-tp16-caps-mem080",
        "h100x16-r1-tp16-caps-mem088")
TERMS = ("weights (non-expert)", "routed experts", "KV read", "all-reduce alpha (IB)", "all-reduce bytes",
         "cross-node layer", "fixed (step + layers)", "eager CPU launch beyond GPU", "compute / roofline rest")


def comm_terms(m, tokens: int) -> dict[str, float]:
    """A forward's collectives on this model: two all-reduces per layer (alpha and bytes) and the cross-node layer cost."""
    layers = m.arch.num_hidden_layers
    links = collectives.link_figures(m.gpu, m.comm_efficiency)
    nbytes = tokens * m.arch.hidden_size * 2
    total = 2 * layers * m._allreduce_s(nbytes)
    alpha = 2 * layers * (links.inter_latency_s if m._tp_spans_nodes else links.intra_latency_s)
    return {"all-reduce alpha (IB)": alpha, "all-reduce bytes": total - alpha,
            "cross-node layer": layers * (links.inter_tp_layer_s or 0.0) if m._tp_spans_nodes else 0.0}


def decode_terms(m, bs: int, ctx: float, seconds: float) -> dict[str, float]:
    """One decode step's `seconds` by term (the roofline path every cross-node TP group takes)."""
    hbm = m.gpu.hbm_tb_s * 1e12
    weights, routed = m._weight_bytes_read(bs)
    routed_share = m.gpu.routed_read_share or m.efficiency_decode
    speed = m.attention_speed  # the roofline step is divided by it as a whole
    terms = {"weights (non-expert)": (weights - routed) / (hbm * m.efficiency_decode),
             "routed experts": routed / (hbm * routed_share),
             "KV read": ctx * m.kv_bytes_per_gpu_token() / (hbm * m.efficiency_decode),
             **comm_terms(m, bs),
             "fixed (step + layers)": m.gpu.step_overhead_s + m.arch.num_hidden_layers * m.gpu.layer_overhead_s}
    terms = {k: v / speed for k, v in terms.items()}
    gpu = m.decode_step_s(bs, ctx) if not m.decode_runs_eager(bs) else None
    if gpu is None:  # eager: max(GPU work, CPU launch); the launch's excess is its own term
        gpu = sum(terms.values())
        terms["eager CPU launch beyond GPU"] = max(0.0, seconds - gpu)
    terms["compute / roofline rest"] = seconds - sum(terms.values())
    return terms


def prefill_terms(m, tokens: int, seconds: float) -> dict[str, float]:
    """One prefill forward's `seconds` by term: collectives, fixed costs, and the rest (compute at the prefill share)."""
    terms = {**comm_terms(m, tokens),
             "fixed (step + layers)": m.gpu.step_overhead_s + m.arch.num_hidden_layers * m.gpu.layer_overhead_s}
    terms["compute / roofline rest"] = seconds - sum(terms.values())
    return terms


def row_report(row: dict, batches: dict) -> list[str]:
    cfg = load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
    batch = sent_batch(row, batches, DATASET.parent)
    role, _, group = cfg.layout.groups()[0]
    version = row.get("sglang_version")
    m = cost_model_for(cfg, role, group, sglang_version=version)
    phase: dict[str, defaultdict[str, float]] = {k: defaultdict(float) for k in ("prefill", "decode")}
    counts = {"prefill": [0, 0, 0.0], "graphed decode": [0, 0, 0.0], "eager decode": [0, 0, 0.0]}
    trace: dict = {"first_decode": None, "last_prefill_end": 0.0, "seqs": {}, "limits": None, "decodes": []}
    longest = max(range(len(batch)), key=lambda i: batch[i][1])

    def observe(now, server, forward, schedule) -> None:
        trace["limits"] = schedule.limits
        if forward.kind == "prefill":
            tokens = sum(t for _, t in forward.prefill)
            for seq, _ in forward.prefill:
                trace["seqs"].setdefault(id(seq), [seq, now, None])
            trace["last_prefill_end"] = now + forward.duration_s
            for k, v in prefill_terms(m, tokens, forward.duration_s).items():
                phase["prefill"][k] += v
            key, size = "prefill", tokens
        else:
            size = len(forward.running)
            ctx = sum(s.prompt_len + schedule.generated(s) for s in forward.running)
            trace["first_decode"] = now if trace["first_decode"] is None else trace["first_decode"]
            for seq in forward.running:
                trace["seqs"][id(seq)][2] = now + forward.duration_s
            for k, v in decode_terms(m, size, ctx, forward.duration_s).items():
                phase["decode"][k] += v
            key = "eager decode" if m.decode_runs_eager(size) else "graphed decode"
            trace["decodes"].append((now, key))
        counts[key][0] += 1
        counts[key][2] += size

    run = simulate_run(cfg, batch, max_concurrency=None, sglang_version=version, observe=observe)
    for now, key in trace["decodes"]:
        counts[key][1] += now >= trace["last_prefill_end"]
    limits, meas = trace["limits"], row["measured"]
    tok_s = (run.input_tokens + run.output_tokens) / run.duration_s
    sglang = cfg.engine.sglang
    out = [f"== {row['id']}: measured {meas['duration_s']:.1f} s, {meas['total_tok_s']:,} total tok/s; "
           f"model {run.duration_s:.1f} s, {tok_s:,.0f} ({tok_s / meas['total_tok_s'] - 1:+.1%})",
           f"   given: SGLang {version}, {len(batch)} prompts (order {row.get('ordering')}), load_format "
           f"{m.load_format}, --mem-fraction-static {sglang.mem_fraction_static} -> {m.mem_fraction_static:.3f}, "
           f"--max-running-requests {group.max_running_requests} -> {limits.max_running}, --cuda-graph-max-bs "
           f"{group.cuda_graph_max_bs} -> graphs to {max(m.graph_batch_sizes())}, chunked prefill "
           f"{limits.chunked_prefill_tokens}, KV pool {limits.kv_capacity_tokens:,} tokens, attention backend "
           f"{m.attention_backend or 'fa3'} (speed {m.attention_speed}), retracted {run.retracted}"]
    for key, (n, tail_n, size) in counts.items():
        if n:
            unit = "tokens" if key == "prefill" else "requests"
            out.append(f"   {key:15s} {n:6d} forwards (after the last prefill: {tail_n:5d}), mean {size / n:8.1f} {unit}")
    for name, terms in phase.items():
        total = sum(terms.values())
        parts = ", ".join(f"{k} {terms[k]:.2f}" for k in TERMS if k in terms)
        out.append(f"   {name} {total:6.2f} s = {parts}")
    first, end_prefill = trace["first_decode"] or 0.0, trace["last_prefill_end"]
    out.append(f"   start (before the first decode step) {first:.2f} s; admission ends (last prefill) at "
               f"{end_prefill:.2f} s; tail (decode only) {run.duration_s - end_prefill:.2f} s "
               f"({(run.duration_s - end_prefill) / run.duration_s:.0%} of the run)")
    longest_seq = next(v for v in trace["seqs"].values() if v[0].max_new_tokens == batch[longest][1])
    last_seq = max(trace["seqs"].values(), key=lambda v: v[2] or 0.0)
    for label, (seq, admitted, done) in (("longest output", longest_seq), ("last to finish", last_seq)):
        out.append(f"   {label}: {seq.max_new_tokens} output tokens (prompt {seq.prompt_len}), first prefill at "
                   f"{admitted:.2f} s, last token at {done:.2f} s")
    return out


def version_sensitivity(row: dict, batches: dict, version: str) -> str:
    """The row predicted as if its run had used SGLang `version` (a sensitivity, not the back-test's prediction)."""
    cfg = load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
    run = simulate_run(cfg, sent_batch(row, batches, DATASET.parent), max_concurrency=None, sglang_version=version)
    tok_s = (run.input_tokens + run.output_tokens) / run.duration_s
    return f"   {row['id']}: {run.duration_s:.1f} s, {tok_s:,.0f} total tok/s ({tok_s / row['measured']['total_tok_s'] - 1:+.1%})"


def order_sensitivity(row: dict, batches: dict, seeds: range) -> str:
    """The row predicted with its batch in random orders: the published runs' per-request lengths and their order
    are unknown (the batch is the V2-Lite sample repeated twice and scaled), and bench's sample order is random in
    length, so each shuffle is an equally likely order; the spread is what the order alone can move."""
    cfg = load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
    batch, errors = sent_batch(row, batches, DATASET.parent), []
    for seed in seeds:
        shuffled = list(batch)
        random.Random(seed).shuffle(shuffled)
        run = simulate_run(cfg, shuffled, max_concurrency=None, sglang_version=row.get("sglang_version"))
        errors.append((run.input_tokens + run.output_tokens) / run.duration_s / row["measured"]["total_tok_s"] - 1)
    errors.sort()
    return (f"   {row['id']}: {len(errors)} orders, error {errors[0]:+.1%} .. {errors[-1]:+.1%} "
            f"(median {statistics.median(errors):+.1%})")


def main() -> None:
    data = load_dataset()
    rows = {r["id"]: r for r in data["runs"]}
    for rid in ROWS:
        print("\n".join(row_report(rows[rid], data["batches"])))
    print("== sensitivity: the same rows as if run with SGLang 0.5.17's defaults and graph list (the organisers' 2025 "
          "application notes install sglang[all]>=0.5.0rc2; the rows say 0.4.10)")
    for rid in ROWS:
        print(version_sensitivity(rows[rid], data["batches"], "0.5.17"))
    print("== sensitivity: the same rows with their batch shuffled (seeds 0-9; the back-test sends the repeated batch in "
          "its sample order)")
    for rid in ROWS:
        print(order_sensitivity(rows[rid], data["batches"], range(10)))


if __name__ == "__main__":
    main()
