"""The Qwen3-shaped lone graphed grid on one H200 against its prediction recorded before the run (issue 25).

    .venv/bin/python benchmarks/qwen3_h200_lone_read.py

Measured: benchmarks/results/2026-11-26-qwen3-h200-lone/call2-profile/calibration-qwen3-l6.json.xz (the `profile` phase
of scripts/device/qwen3_probe.sh; step = batch / logged gen throughput, median per point). Predicted before the run:
benchmarks/results/2026-11-26-qwen3-h200-lone-predicted/output.txt (368c625): the planner's step on the H200's lent
floor, and the same step with the H100's per-step floor (the alternative hypothesis). Model now: the planner's step
on this checkout (qwen3_decode_terms.model_terms). The H100's grid (lease 3, call 6) is printed beside for the ratio.
A point whose batch never ran whole (the harness's send spread) has no step and is left out of every MAPE.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.compressed import read_text  # noqa: E402
from benchmarks.qwen3_decode_terms import LONE, model_terms  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MEASURED = RESULTS / "2026-11-26-qwen3-h200-lone" / "call2-profile" / "calibration-qwen3-l6.json.xz"
PREDICTED = RESULTS / "2026-11-26-qwen3-h200-lone-predicted" / "output.txt"


def steps(path: Path) -> dict[tuple[int, int], float | None]:
    """(batch, context) -> the graphed decode step in ms (None where no step was logged at the whole batch)."""
    points = json.loads(read_text(path))["runs"][0]["decode"]
    return {(p["batch_size"], p["context_tokens"]): p["step_ms_median"] for p in points}


def predicted() -> dict[tuple[int, int], tuple[float, float]]:
    """(batch, context) -> (model, with H100 step floor) in ms, as recorded at 368c625."""
    rows = {}
    for line in PREDICTED.read_text().splitlines():
        cells = line.split()
        if len(cells) == 4 and cells[0].isdigit():
            rows[(int(cells[0]), int(cells[1]))] = (float(cells[2]), float(cells[3]))
    return rows


def main() -> int:
    h200, h100, before = steps(MEASURED), steps(ROOT / LONE[0]), predicted()
    cfg_path = LONE[1]
    print(f"H200, lone graphed Qwen3-shaped server ({MEASURED.relative_to(ROOT)}), decode step ms")
    print(f"{'batch':>5} {'ctx':>5} {'measured':>8} {'368c625':>7} {'err':>7} {'H100 floor':>10} {'err':>7}"
          f" {'model now':>9} {'err':>7} {'H100 meas':>9} {'H200/H100':>9}")
    errs: dict[str, list[float]] = {"368c625 model": [], "368c625 with H100 step floor": [], "model now": []}
    wide: dict[str, list[float]] = {k: [] for k in errs}  # batch 4 and up
    for (batch, ctx), then in sorted(before.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        measured, model_then, alt_then = h200.get((batch, ctx)), then[0], then[1]
        now = model_terms(cfg_path, "H200", batch, ctx, role="aggregated")["step"] * 1e3
        ref = h100.get((batch, ctx))
        if measured is None:
            print(f"{batch:>5} {ctx:>5} {'-':>8} {model_then:>7.2f} {'':>7} {alt_then:>10.2f} {'':>7} {now:>9.2f} {'':>7}"
                  f" {ref or float('nan'):>9.3f} {'':>9}  (no step at the whole batch: left out)")
            continue
        e = {"368c625 model": model_then / measured - 1, "368c625 with H100 step floor": alt_then / measured - 1,
             "model now": now / measured - 1}
        for k, err in e.items():
            errs[k].append(abs(err))
            if batch >= 4:
                wide[k].append(abs(err))
        ratio = f"{measured / ref:>9.2f}" if ref else f"{'':>9}"
        print(f"{batch:>5} {ctx:>5} {measured:>8.3f} {model_then:>7.2f} {e['368c625 model']:>+7.1%} {alt_then:>10.2f}"
              f" {e['368c625 with H100 step floor']:>+7.1%} {now:>9.2f} {e['model now']:>+7.1%} {ref or float('nan'):>9.3f}"
              f" {ratio}")
    for k, all_errs in errs.items():
        inside = sum(x <= 0.15 for x in all_errs)
        print(f"MAPE {k}: {statistics.mean(all_errs):.1%} over {len(all_errs)} points ({inside} within 15 %,"
              f" max {max(all_errs):.1%});"
              f" batch 4-256: {statistics.mean(wide[k]):.1%} over {len(wide[k])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
