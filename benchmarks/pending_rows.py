"""Predict back-test rows before their run exists, by the back-test's own path, so the commit that records the
prediction comes before the measurement (the rows go into benchmarks/backtest/runs.yaml once measured).

    .venv/bin/python benchmarks/pending_rows.py PENDING.yaml [--json OUT.json]

PENDING.yaml: `rows:` in runs.yaml's form without `measured` (id, config, set, batch, bound, ...; the batches are
runs.yaml's) and optional `derived:` ratios of two pending rows. Prints one line per row (predicted total tok/s and
run seconds) and each derived ratio; --json writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.config import load_config  # noqa: E402
from orchestrator.plan.backtest.dataset import DATASET, BacktestError, load_dataset, sent_batch  # noqa: E402
from orchestrator.plan.simulation.simulate import simulate_run  # noqa: E402


def predict(pending: dict) -> dict:
    batches = load_dataset(DATASET)["batches"]
    rows = {}
    for row in pending["rows"]:
        cfg = load_config(ROOT / row["config"], list(row.get("set", [])), paths_from=ROOT)
        batch = sent_batch(row, batches, DATASET.parent)  # in the order its client sends it, as the back-test
        run = simulate_run(cfg, batch, max_concurrency=None, sglang_version=row.get("sglang_version"))
        rows[row["id"]] = {"total_tok_s": round(run.total_throughput, 1), "duration_s": round(run.duration_s, 4),
                           "batch": row["batch"], "bound": row.get("bound")}
    derived = {d["id"]: round(rows[d["numerator"]]["total_tok_s"] / rows[d["denominator"]]["total_tok_s"], 4)
               for d in pending.get("derived", []) if {d["numerator"], d["denominator"]} <= rows.keys()}
    return {"rows": rows, "derived": derived}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pending", help="YAML with rows: (runs.yaml's form, no measured) and optional derived:")
    p.add_argument("--json", help="write the predictions here")
    a = p.parse_args(argv)
    try:
        out = predict(yaml.safe_load(Path(a.pending).read_text()))
    except BacktestError as exc:  # a row the back-test would refuse, e.g. without its ordering
        print(f"{a.pending}: {exc}", file=sys.stderr)
        return 2
    for rid, r in out["rows"].items():
        print(f"{rid:60s} predicted {r['total_tok_s']:>10,.0f} total tok/s  run {r['duration_s']:.3f} s  ({r['batch']})")
    for rid, ratio in out["derived"].items():
        print(f"{rid:60s} predicted ratio {ratio:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
