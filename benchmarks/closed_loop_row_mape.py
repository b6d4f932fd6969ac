"""MAPE per set of closed-loop back-test rows, before and after a model change, from two saved `plan --backtest
--closed-loop` outputs.

    .venv/bin/python benchmarks/closed_loop_row_mape.py BEFORE.txt AFTER.txt

A row's set is named by its id's prefix (the organisers' full-size H100 reference, the 6-layer pair on one H100 through
either gateway, the pair on two H200s); per set and metric (output tok/s, TTFT p50, ITL p50) the mean |error| of the
measured rows, as the table prints each error (a whole per cent), and how many bounded metrics are inside.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

SETS: dict[str, tuple[str, ...]] = {  # set -> row id prefixes
    "organisers' H100 reference (full size, real weights)": ("organisers-h100-reference-",),
    "one H100 shared by the pair (both gateways)": ("hdev-h100x1-",),
    "two H200s, a GPU per server (leases 2, 5 and 11)": ("hdev-h200x2-", "hgpu5-h200x2-", "hqx2-h200x2-")}
METRICS = ("out tok/s", "TTFT p50", "ITL p50")
CELL = re.compile(r"/ [\d,.]+ \(([+-]\d+)%( ok| MISS)?\)")


def row_errors(path: Path) -> dict[str, list[tuple[int, str]]]:
    """row id -> [(error %, '' | 'ok' | 'MISS')] for out tok/s, TTFT p50, ITL p50 (measured rows only)."""
    out = {}
    for line in path.read_text().splitlines():
        cells = CELL.findall(line)
        if len(cells) >= 3:
            out[line.split()[0]] = [(int(e), flag.strip()) for e, flag in cells[:3]]
    return out


def main(argv: list[str]) -> int:
    before, after = row_errors(Path(argv[0])), row_errors(Path(argv[1]))
    print(f"{'set':<55}{'rows':>8}  " + "  ".join(f"{m + ' MAPE before -> after':>30}" for m in METRICS))
    for name, prefix in SETS.items():  # rows measured since (a new lease's) count in the after column only
        ids = [r for r in after if r.startswith(prefix)]
        old = [r for r in ids if r in before]
        cells = []
        for k in range(len(METRICS)):
            b = statistics.fmean(abs(before[r][k][0]) for r in old)
            a = statistics.fmean(abs(after[r][k][0]) for r in ids)
            cells.append(f"{b:>14.1f} % -> {a:>5.1f} %")
        print(f"{name:<55}{f'{len(old)}->{len(ids)}':>8}  " + "  ".join(f"{c:>30}" for c in cells))
    inside = [sum(flag == "ok" for cells in rows.values() for _, flag in cells) for rows in (before, after)]
    bounded = [sum(flag in ("ok", "MISS") for cells in rows.values() for _, flag in cells) for rows in (before, after)]
    print(f"bounded metrics (tok/s, TTFT, ITL) inside the bound set before the run: {inside[0]} of {bounded[0]} -> "
          f"{inside[1]} of {bounded[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
