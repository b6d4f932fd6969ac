"""Reads what scripts/device/qwen3_probe.sh brought back and turns it into what the planner needs (issue 25).

    .venv/bin/python benchmarks/qwen3_routing_read.py benchmarks/results/<date>-qwen3-probe-<gpu>/ [--json]

The folder holds routing.json (the counts), qwen3-probe.tar.xz (a cut count phase's trace is read from there) and
calibration-qwen3-l6.json (the lone server's decode grid). Printed: distinct routed experts per MoE layer call at each
decode batch, dummy weights vs randomised gates vs the uniform formula n (1 - (1 - k/n)^B); the expert bytes one decode
step reads per MoE layer for each (bytes per expert from the planner's own weight table, so the number is the one
`timing._weight_bytes_read` would use); the outcome under the rule recorded in docs/fidelity.md before the run
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.config import load_config
from orchestrator.perfmodel.costmodel import cost_model_for

COUNT_VARIANTS = {"dummy-eager-count": "dummy", "random-eager-count": "random"}
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
    cfg = load_config(config, [f"cluster.gpu={gpu}"])
    model = cost_model_for(cfg, "decode", cfg.layout.decode[0])
    arch = model.arch
    routed = model.weight_bytes_breakdown()["routed_experts"]
    return routed / (arch.n_routed_experts * arch.moe_layers), arch.num_experts_per_tok, arch.n_routed_experts, arch.moe_layers


def grid(folder: Path) -> list[dict]:
    """The lone server's decode points: batch, context, step ms, graph, client tok/s ((prompt + output) / wall)."""
    raw_path = folder / "calibration-qwen3-l6.json"
    if not raw_path.is_file():
        return []
    raw = json.loads(raw_path.read_text())
    rows = []
    for run in raw.get("runs", []):
        for r in run.get("decode") or []:
            if r.get("skipped") or not r.get("client"):
                continue
            c = r["client"]
            rows.append({"batch": r["batch_size"], "context": r["context_tokens"], "step_ms": r.get("step_ms_median"),
                         "graph": r.get("cuda_graph"),
                         "tok_s": round((c["input_tokens"] + c["completion_tokens"]) / c["wall_s"]) if c.get("wall_s") else None})
    return rows


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
        lines += ["", "| batch | context | step ms | graph | client tok/s |", "|---:|---:|---:|---|---:|"]
        lines += [f"| {g['batch']} | {g['context']} | {g['step_ms']} | {g['graph']} | {g['tok_s']} |" for g in rep["grid"]]
    lines += ["", "routing points (the planner's RoutingPoint rows): " + json.dumps(rep["routing_points"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="the probe's results folder (routing.json, qwen3-probe.tar.xz, calibration-qwen3-l6.json)")
    p.add_argument("--config", default="configs/device-h200x2-qwen3-serve.yaml", help="the Qwen3-shaped config whose decode server is priced")
    p.add_argument("--gpu", default="H200", help="cost-model GPU of the bytes per expert (H200 | H100-SXM; the bytes do not depend on it)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    a = p.parse_args(argv)
    if not a.folder.is_dir():
        p.error(f"{a.folder}: not a folder; give the probe's results folder")
    if not any((a.folder / f).is_file() for f in ("routing.json", "qwen3-probe.tar.xz", "calibration-qwen3-l6.json")):
        p.error(f"{a.folder}: holds none of routing.json, qwen3-probe.tar.xz, calibration-qwen3-l6.json")
    rep = report(a.folder, a.config, a.gpu)
    print(json.dumps(rep, indent=1) if a.json else _text(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
