"""Reads what scripts/device/qwen3_probe.sh brought back and turns it into what the planner needs (issue 25).

    .venv/bin/python benchmarks/qwen3_routing_read.py benchmarks/results/<date>-qwen3-probe-<gpu>/ [--json]

The folder holds routing.json (the counts), qwen3-probe.tar.xz (a cut count phase's trace is read from there) and
calibration-qwen3-l6.json (the lone server's decode grid). Printed: distinct routed experts per MoE layer call at each
decode batch, dummy weights vs randomised gates vs the uniform formula n (1 - (1 - k/n)^B); the expert bytes one decode
step reads per MoE layer for each (bytes per expert from the planner's own weight table, so the number is the one
`ForwardTerms._weight_bytes_read` would use); the outcome under the rule recorded in docs/fidelity.md before the run
(`outcome`); the measured points as the planner's RoutingPoint rows; and the decode grid (step ms, client tok/s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.compressed import read_text  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402

COUNT_VARIANTS = {"dummy-eager-count": "dummy", "random-eager-count": "random"}
GPU_KEYS = {"H200": "H200", "H100": "H100-SXM"}
# The rule recorded in docs/fidelity.md ("The Qwen3 routing probe: what the model does with each outcome") before
# the probe ran; changing these after the run would make it a rule chosen on the result.
DECIDING_BATCH = 64
COLLAPSED_AT_MOST = 16          # <= 2 x top_k distinct experts at the deciding batch: collapsed, as R1 (10 of 256)
UNIFORM_AT_LEAST = 0.80         # >= 80 % of the uniform formula there: dummy weights route like real ones
RANDOM_CHECK_BATCHES = (8, 16, 32, 64)
RANDOM_CHECK_TOLERANCE = 0.10   # randomised gates within 10 % of the formula, else the hook is suspect


def uniform_distinct(tokens: int, top_k: int, n_experts: int) -> float:
    """Expected distinct experts when each of `tokens` tokens picks top_k of n_experts uniformly."""
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)


@dataclass(frozen=True)
class Count:
    batch: int
    calls: int
    mean: float
    median: float
    low: int
    high: int


def _summarise(rows: list[dict], batches: list[int]) -> dict[int, Count]:
    out = {}
    for b in batches:
        seen = [r["distinct"] for r in rows if r["tokens"] == b]
        if seen:
            out[b] = Count(b, len(seen), statistics.mean(seen), statistics.median(seen), min(seen), max(seen))
    return out


def _trace_rows(archive: Path, variant: str) -> list[dict]:
    if not archive.is_file():
        return []
    with tarfile.open(archive) as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith(f"trace-{variant}.jsonl")), None)
        if member is None:
            return []
        text = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_counts(folder: Path, batches: list[int]) -> dict[str, dict[int, Count]]:
    """{'dummy' | 'random': {batch: Count}}: routing.json's per-batch summary, else (a phase cut before its summary)
    the trace in qwen3-probe.tar.xz."""
    routing = json.loads((folder / "routing.json").read_text()) if (folder / "routing.json").is_file() else {}
    out: dict[str, dict[int, Count]] = {}
    for variant, gate in COUNT_VARIANTS.items():
        summary = (routing.get(variant) or {}).get("distinct_experts") or {}
        if summary:
            out[gate] = {int(b): Count(int(b), s["calls"], s["mean"], s.get("median", s["mean"]), s["min"], s["max"])
                         for b, s in summary.items()}
        elif rows := _trace_rows(folder / "qwen3-probe.tar.xz", variant):
            out[gate] = _summarise(rows, batches)
    return out


def outcome(counts: dict[str, dict[int, Count]], top_k: int, n_experts: int) -> tuple[str, str]:
    """The pre-recorded rule: ('collapsed' | 'partial' | 'uniform' | 'hook-suspect' | 'not measured', why)."""
    dummy, random_gate = counts.get("dummy", {}), counts.get("random", {})
    if DECIDING_BATCH not in dummy:
        return "not measured", f"no dummy-weight count at batch {DECIDING_BATCH}"
    bad = [b for b in RANDOM_CHECK_BATCHES if b in random_gate
           and abs(random_gate[b].mean / uniform_distinct(b, top_k, n_experts) - 1) > RANDOM_CHECK_TOLERANCE]
    if bad:
        return "hook-suspect", (f"randomised gates off the uniform formula by > {RANDOM_CHECK_TOLERANCE:.0%} at batch "
                                f"{bad}: the count is not adopted")
    d = dummy[DECIDING_BATCH].mean
    uniform = uniform_distinct(DECIDING_BATCH, top_k, n_experts)
    checked = "randomised gates match the formula" if random_gate else "no randomised-gate check (not measured)"
    if d <= COLLAPSED_AT_MOST:
        return "collapsed", f"{d:.1f} <= {COLLAPSED_AT_MOST} distinct experts at batch {DECIDING_BATCH}; {checked}"
    if d >= UNIFORM_AT_LEAST * uniform:
        return "uniform", f"{d:.1f} >= {UNIFORM_AT_LEAST:.0%} of {uniform:.1f} at batch {DECIDING_BATCH}; {checked}"
    return "partial", f"{d:.1f} between {COLLAPSED_AT_MOST} and {UNIFORM_AT_LEAST * uniform:.1f} at batch {DECIDING_BATCH}; {checked}"


def expert_bytes_per_layer(config: str, gpu: str) -> tuple[float, int, int, int]:
    """(bytes of one routed expert in one MoE layer on one GPU, top_k, routed experts, MoE layers) from the planner's
    weight table for the decode server of `config`."""
    cfg = load_config(ROOT / config, [f"cluster.gpu={gpu}"], paths_from=ROOT)
    model = cost_model_for(cfg, "decode", cfg.layout.decode[0])
    arch = model.arch
    routed = model.weight_bytes_breakdown()["routed_experts"]
    return routed / (arch.n_routed_experts * arch.moe_layers), arch.num_experts_per_tok, arch.n_routed_experts, arch.moe_layers


LONE_CONFIG = "benchmarks/backtest/configs/qwen3-l6-lone.yaml"
RAW_NAME = "calibration-qwen3-l6.json"  # the probe's name for it (scripts/device/qwen3_probe.sh)


def raw_file(folder: Path) -> Path | None:
    """The probe's raw calibration file in `folder`: as the device wrote it, or committed xz-compressed."""
    return next((p for p in (folder / RAW_NAME, folder / f"{RAW_NAME}.xz") if p.is_file()), None)


def grid(folder: Path) -> list[dict]:
    """The lone server's decode points: batch, context, step ms, graph, client tok/s ((prompt + output) / wall), and
    the planner's step now (benchmarks/backtest/configs/qwen3-l6-lone.yaml on the raw file's GPU, the KV of B
    requests at C + 50 tokens: the middle of the 100 steps)."""
    raw_path = raw_file(folder)
    if raw_path is None:
        return []
    raw = json.loads(read_text(raw_path))
    gpu = next((v for k, v in GPU_KEYS.items() if k in str(raw.get("gpu", {}).get("name"))), None)
    model = None
    if gpu is not None:
        cfg = load_config(ROOT / LONE_CONFIG, [f"cluster.gpu={gpu}"], paths_from=ROOT)
        model = cost_model_for(cfg, "aggregated", cfg.layout.aggregated[0])
    rows = []
    for run in raw.get("runs", []):
        for r in run.get("decode") or []:
            if r.get("skipped") or not r.get("client"):
                continue
            c = r["client"]
            rows.append({"batch": r["batch_size"], "context": r["context_tokens"], "step_ms": r.get("step_ms_median"),
                         "graph": r.get("cuda_graph"), "model_ms": model and round(
                             model.decode_step_s(r["batch_size"], r["batch_size"] * (r["context_tokens"] + 50)) * 1e3, 2),
                         "tok_s": round((c["input_tokens"] + c["completion_tokens"]) / c["wall_s"]) if c.get("wall_s") else None})
    return rows


# The calibration points recorded in docs/fidelity.md as the grid's out-of-sample back-test rows, before the run:
# (measure, batch or concurrency, context or prompt tokens)
RECORDED_ROWS = [("decode", 4, 4096), ("decode", 16, 4096), ("decode", 64, 1024), ("decode", 256, 256), ("prefill", 1, 4096)]
def backtest_rows(folder: Path, evidence_dir: str, bound_set: str) -> str:
    """runs.yaml rows (and their batches) for RECORDED_ROWS from the raw file, as text to paste; a point the run
    did not measure is named in a comment, not invented."""
    raw_path = raw_file(folder)
    assert raw_path is not None, folder
    raw = json.loads(read_text(raw_path))
    run = raw["runs"][0]
    gpu_name = raw["gpu"]["name"]
    key = next((v for k, v in GPU_KEYS.items() if k in gpu_name), None)
    if key is None:
        raise ValueError(f"gpu.name={gpu_name!r}: neither H200 nor H100")
    slug = key.split("-")[0].lower()
    machine = f"{gpu_name} ({raw['gpu'].get('memory_total_mib', 0):,} MiB), GPU 0 of hgpu's lease"
    batches, rows = [], []
    for measure, k, length in RECORDED_ROWS:
        if measure == "prefill":
            point = next((r for r in run.get("prefill") or [] if (r.get("concurrency"), r.get("input_tokens")) == (k, length)
                          and r.get("latency_s_median")), None)
            name, raw_point = f"qwen3l6-prefill-{k}x{length}", f"{{variant: {run['variant']}, measure: prefill, concurrency: {k}, input_tokens: {length}}}"
            if point is None:
                rows.append(f"  # {name}: not measured in {evidence_dir}")
                continue
            seconds, tokens_in, tokens_out = point["latency_s_median"], k * length, k
            what = f"prefill k={k} L={length}, latency_s_median = the last of k answers, median of 3 after a first"
            batches.append(f"  {name}: {{uniform: {{requests: {k}, input: {length}, output: 1}}}}")
        else:
            point = next((r for r in run.get("decode") or [] if (r.get("batch_size"), r.get("context_tokens")) == (k, length)
                          and (r.get("client") or {}).get("wall_s")), None)
            name, raw_point = f"qwen3l6-{k}x{length}", f"{{variant: {run['variant']}, measure: decode, batch_size: {k}, context_tokens: {length}}}"
            if point is None:
                rows.append(f"  # {name}: not measured in {evidence_dir}")
                continue
            c = point["client"]
            seconds, tokens_in, tokens_out = c["wall_s"], c["input_tokens"], c["completion_tokens"]
            what = f"decode B={k} C={length}, client.wall_s"
            batches.append(f"  {name}: {{uniform: {{requests: {k}, input: {length}, output: 100}}}}")
        total = round((tokens_in + tokens_out) / seconds)
        rows.append("\n".join([
            f"  - id: {slug}-{name}-lone", "    kind: throughput", "    source: measured",
            f"    evidence: {evidence_dir}{raw_path.name} ({what})", f"    raw_point: {raw_point}",
            "    date: 2026-11-26", f"    machine: {machine}",
            f"    conditions: one {key}, Qwen3-235B-A22B layer shape 6 layers FP8, dummy weights, triton, mem 0.70, graphs 1..256, "
            f"chunked prefill 8192, {k} x {length}-token prompts at once, {tokens_out // k} out",
            "    config: benchmarks/backtest/configs/qwen3-l6-lone.yaml", f"    set: [cluster.gpu={key}]", f"    batch: {name}",
            f"    measured: {{duration_s: {seconds:.4f}, input_tokens: {tokens_in}, output_tokens: {tokens_out}, total_tok_s: {total}}}",
            "    bound: 0.15", f'    bound_set: "{bound_set}"',
            "    sample: out  # no profile was fitted on the Qwen3 grid (docs/fidelity.md, the rule recorded before the probe)"]))
    return "batches:\n" + "\n".join(batches) + "\nruns:\n" + "\n".join(rows)


def report(folder: Path, config: str, gpu: str) -> dict:
    per_expert, top_k, n, moe_layers = expert_bytes_per_layer(config, gpu)
    routing = json.loads((folder / "routing.json").read_text()) if (folder / "routing.json").is_file() else {}
    batches = sorted({int(b) for v in COUNT_VARIANTS for b in ((routing.get(v) or {}).get("distinct_experts") or {})}
                     | {1, 2, 4, 8, 16, 32, 64, 128, 256, 512})
    counts = load_counts(folder, batches)
    verdict, why = outcome(counts, top_k, n)
    table = []
    for b in batches:
        d, r = counts.get("dummy", {}).get(b), counts.get("random", {}).get(b)
        u = uniform_distinct(b, top_k, n)
        if d is None and r is None:
            continue
        table.append({"batch": b, "dummy_mean": d and round(d.mean, 2), "dummy_median": d and d.median,
                      "random_mean": r and round(r.mean, 2), "uniform": round(u, 1),
                      "mb_per_layer_dummy": d and round(d.mean * per_expert / 1e6, 1),
                      "mb_per_layer_random": r and round(r.mean * per_expert / 1e6, 1),
                      "mb_per_layer_uniform": round(u * per_expert / 1e6, 1)})
    points = [{"tokens": b, "distinct_experts": round(c.mean, 2), "gate": gate, "calls": c.calls}
              for gate, by_batch in counts.items() for b, c in sorted(by_batch.items())]
    return {"folder": str(folder), "gpu": gpu, "expert_mb_per_layer": round(per_expert / 1e6, 2), "top_k": top_k,
            "routed_experts": n, "moe_layers": moe_layers, "outcome": verdict, "why": why, "counts": table,
            "routing_points": points, "grid": grid(folder)}


ADOPTED = ("collapsed", "partial")   # the outcomes under which the recorded rule ships the measured curve


def routing_curve(rep: dict, config: str, raw_dir: str) -> dict:
    """The profiles/routing/ file of the Qwen3 shape (perfmodel.profile.RoutingCurve), only when the recorded rule
    adopts the count; ValueError naming the outcome otherwise."""
    if rep["outcome"] not in ADOPTED:
        raise ValueError(f"outcome {rep['outcome']!r} ({rep['why']}): the recorded rule ships no curve")
    from orchestrator.perfmodel.profile import ProfileModel, RoutingCurve

    cfg = load_config(ROOT / config, paths_from=ROOT)
    arch = cost_model_for(cfg, "decode", cfg.layout.decode[0]).arch
    model = ProfileModel(name=Path(cfg.model.path or arch.name).name, hidden_size=arch.hidden_size, num_hidden_layers=arch.num_hidden_layers,
                         first_k_dense_replace=arch.first_k_dense_replace, n_routed_experts=arch.n_routed_experts,
                         num_experts_per_tok=arch.num_experts_per_tok, moe_intermediate_size=arch.moe_intermediate_size,
                         num_attention_heads=arch.num_attention_heads, kv_lora_rank=arch.kv_lora_rank,
                         qk_rope_head_dim=arch.qk_rope_head_dim, quantization=cfg.model.quantization)
    curve = RoutingCurve(model=model, raw=raw_dir, command="bash scripts/device/qwen3_probe.sh (its manifest.json)",
                         routing=rep["routing_points"])
    return curve.model_dump()


def _text(rep: dict) -> str:
    lines = [f"{rep['folder']}: one routed expert = {rep['expert_mb_per_layer']} MB per MoE layer ({rep['gpu']}, planner's "
             f"weight table); top_k {rep['top_k']} of {rep['routed_experts']}, {rep['moe_layers']} MoE layers",
             f"outcome under the recorded rule: {rep['outcome']} ({rep['why']})", "",
             "| batch | dummy weights: distinct (median) | randomised gates | uniform formula | expert MB read per MoE layer: dummy / random / uniform |",
             "|---:|---:|---:|---:|---|"]
    for r in rep["counts"]:
        lines.append(f"| {r['batch']} | {r['dummy_mean'] if r['dummy_mean'] is not None else '-'} ({r['dummy_median'] if r['dummy_median'] is not None else '-'}) "
                     f"| {r['random_mean'] if r['random_mean'] is not None else '-'} | {r['uniform']} "
                     f"| {r['mb_per_layer_dummy'] if r['mb_per_layer_dummy'] is not None else '-'} / "
                     f"{r['mb_per_layer_random'] if r['mb_per_layer_random'] is not None else '-'} / {r['mb_per_layer_uniform']} |")
    if rep["grid"]:
        lines += ["", "| batch | context | step ms | planner's step ms now | graph | client tok/s |", "|---:|---:|---:|---:|---|---:|"]
        lines += [f"| {g['batch']} | {g['context']} | {g['step_ms']} | {g['model_ms']} | {g['graph']} | {g['tok_s']} |"
                  for g in rep["grid"]]
    lines += ["", "routing points (the planner's RoutingPoint rows): " + json.dumps(rep["routing_points"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="the probe's results folder (routing.json, qwen3-probe.tar.xz, calibration-qwen3-l6.json)")
    p.add_argument("--config", default="configs/device-h200x2-qwen3-serve.yaml", help="the Qwen3-shaped config whose decode server is priced (a relative path from the repository root)")
    p.add_argument("--gpu", default="H200", help="cost-model GPU of the bytes per expert (H200 | H100-SXM; the bytes do not depend on it)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--backtest-rows", metavar="EVIDENCE_DIR",
                   help="print instead the recorded back-test rows for benchmarks/backtest/runs.yaml, their evidence "
                        "under EVIDENCE_DIR (the repository path of the folder, ending in /)")
    p.add_argument("--bound-set", default="2026-11-26 hqprobe: recorded in docs/fidelity.md before the Qwen3 probe ran; "
                   "set with the row, before its first prediction", help="the rows' bound_set text")
    p.add_argument("--write-curve", type=Path, metavar="FILE",
                   help="also write the shape's routing curve (orchestrator/perfmodel/profiles/routing/) when the "
                        "recorded rule adopts the count; refused otherwise")
    a = p.parse_args(argv)
    if not a.folder.is_dir():
        p.error(f"{a.folder}: not a folder; give the probe's results folder")
    if not any((a.folder / f).is_file() for f in ("routing.json", "qwen3-probe.tar.xz")) and raw_file(a.folder) is None:
        p.error(f"{a.folder}: holds none of routing.json, qwen3-probe.tar.xz, calibration-qwen3-l6.json")
    if a.backtest_rows:
        if raw_file(a.folder) is None:
            p.error(f"--backtest-rows: {a.folder} has no calibration-qwen3-l6.json")
        print(backtest_rows(a.folder, a.backtest_rows, a.bound_set))
        return 0
    rep = report(a.folder, a.config, a.gpu)
    print(json.dumps(rep, indent=1) if a.json else _text(rep))
    if a.write_curve:
        try:
            curve = routing_curve(rep, a.config, str(a.folder).rstrip("/") + "/")
        except ValueError as exc:
            print(f"--write-curve: {exc}", file=sys.stderr)
            return 2
        a.write_curve.write_text(json.dumps(curve, indent=1) + "\n")
        print(f"wrote {a.write_curve}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
