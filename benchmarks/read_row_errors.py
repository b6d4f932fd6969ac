"""Two `lease14_tp4_step.py read` outputs of the same raw files (before / after a model change), server by server: the
graphed rows inside the +-15 % tok/s bound and the mean |tok/s error|, over all rows, batch <= 4 and batch >= 8.

    python3 benchmarks/manifest.py record --out benchmarks/results/2026-11-27-shard-profile-match/row-errors -- \\
        .venv/bin/python benchmarks/read_row_errors.py BEFORE/output.txt AFTER/output.txt [BEFORE2 AFTER2 ...]
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

ROW = re.compile(r"\s*(\d+)\s+(\d+)\s+(\d+)\s+True\s+\S+\s+\S+\s+\S+%\s+([+-]?\d+\.\d)%\s+(yes|NO)")
BOUND_PCT = 15.0


def servers(path: Path) -> list[tuple[str, list[tuple[int, float]]]]:
    """(the read's 'on ...' header, [(batch, tok/s error %)] of its graphed rows) per server the output reads."""
    out: list[tuple[str, list[tuple[int, float]]]] = []
    for line in path.read_text().splitlines():
        if line.startswith("on "):
            out.append((line.split(":")[0], []))
        elif out and (m := ROW.match(line)):
            out[-1][1].append((int(m[1]), float(m[4])))
    return out


def summary(rows: list[tuple[int, float]]) -> str:
    def mean(keep) -> str:
        errs = [abs(e) for b, e in rows if keep(b)]
        return f"{statistics.mean(errs):.1f}" if errs else "-"
    inside = sum(abs(e) <= BOUND_PCT for _, e in rows)
    return (f"{inside} of {len(rows)} inside, mean |err| {mean(lambda b: True)} % (batch <= 4: {mean(lambda b: b <= 4)}, "
            f"batch >= 8: {mean(lambda b: b >= 8)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outputs", nargs="+", type=Path, help="BEFORE AFTER pairs of read outputs")
    args = parser.parse_args(argv)
    if len(args.outputs) % 2:
        parser.error("outputs: give BEFORE AFTER pairs (an even number of files)")
    pooled: tuple[list[tuple[int, float]], list[tuple[int, float]]] = ([], [])
    for before, after in zip(args.outputs[::2], args.outputs[1::2]):
        for (head, old), (_, new) in zip(servers(before), servers(after), strict=True):
            print(f"{head}\n  before ({before.parent.name}): {summary(old)}\n  after  ({after.parent.name}): {summary(new)}")
            pooled[0].extend(old)
            pooled[1].extend(new)
    print(f"all servers\n  before: {summary(pooled[0])}\n  after:  {summary(pooled[1])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
