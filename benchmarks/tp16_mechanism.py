"""TP16 across two nodes: issue 14's roofline (the model's default) against the mechanism used inside a node (one
GPU's calibrated step terms at TP16's per-GPU shape, dummy-weight routing, the published cross-node collectives),
on every TP16 row of the back-test; and the issue-14 defaults row re-checked with engine.sglang.version=0.4.10.

Run from the repo root (virtual time, seconds of CPU):
  python3 benchmarks/manifest.py record --out benchmarks/results/<date>-tp16-mechanism -- \
      .venv/bin/python benchmarks/tp16_mechanism.py
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.config import load_config
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.server import forward
from orchestrator.plan.backtest.dataset import DATASET, load_dataset, sent_batch
from orchestrator.plan.backtest.predict import predict_row
from orchestrator.plan.memory.defaults_text import sglang_defaults_text
from orchestrator.plan.simulation.simulate import simulate_run

ROOT = Path(__file__).resolve().parents[1]


def step_breakdown(row: dict, version: str) -> str:
    """One decode step of the row's server at 1,024 running requests of 800 context tokens, by term."""
    cfg = load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
    role, _, group = cfg.layout.groups()[0]
    m = cost_model_for(cfg, role, group, sglang_version=version)
    bs, ctx = 1024, 1024 * 800
    allreduce = 2 * m.arch.num_hidden_layers * m._allreduce_s(bs * m.arch.hidden_size * 2)
    return (f"step {m.decode_step_s(bs, ctx) * 1e3:6.1f} ms (weights {m.weight_read_s(bs) * 1e3:5.1f} ms, "
            f"{2 * m.arch.num_hidden_layers} all-reduces {allreduce * 1e3:5.1f} ms, "
            f"{'calibrated per-GPU terms' if m.calibration and m.calibration.decode and (forward.CALIBRATED_ACROSS_NODES or not m._tp_spans_nodes) else 'roofline'})")


def main() -> None:
    data = load_dataset()
    base = Path(DATASET).parent
    rows = [r for r in data["runs"] if r["kind"] == "throughput" and "tp16" in r["id"]]
    print("TP16 rows of benchmarks/backtest/runs.yaml: measured total tok/s; predicted with the roofline (default) and with")
    print("the mechanism of a TP group inside a node (server/forward.py CALIBRATED_ACROSS_NODES); one decode step at 1,024 x 800 tokens")
    for row in rows:
        version = row.get("sglang_version", "0.5.17")
        cells = []
        for calibrated in (False, True):
            forward.CALIBRATED_ACROSS_NODES = calibrated
            r = predict_row(row, data["batches"], base)
            cells.append(f"{r.predicted:8,.0f} ({r.error:+6.1%})  {step_breakdown(row, version)}")
        forward.CALIBRATED_ACROSS_NODES = False
        print(f"{row['id']}  measured {row['measured']['total_tok_s']:,.0f}  load_format "
              f"{next((s.split('=')[1] for s in row.get('set', []) if 'load_format' in s), 'config')}")
        print(f"  roofline:  {cells[0]}\n  mechanism: {cells[1]}")

    print("\nThe issue-14 defaults row with engine.sglang.version=0.4.10 in the config (the back-test passes the row's")
    print("sglang_version instead): the same prediction, and plan prints that version's defaults")
    row = next(r for r in rows if r["id"] == "h100x16-r1-tp16-sglang-defaults")
    cfg = load_config(ROOT / row["config"], [*row.get("set", []), "engine.sglang.version=0.4.10"], paths_from=ROOT)
    batch = sent_batch(row, data["batches"], base)
    via_config = simulate_run(cfg, batch, max_concurrency=None).total_throughput
    via_row = predict_row(row, data["batches"], base).predicted
    print(f"  via engine.sglang.version: {via_config:,.0f} total tok/s; via the row's sglang_version: {via_row:,.0f}")
    print("  " + sglang_defaults_text(cfg).replace("\n", "\n  "))


if __name__ == "__main__":
    main()
