"""Summary of a py-spy profile in collapsed-stack form (`py-spy record -f raw`): self and inclusive time per frame.

    python3 benchmarks/pyspy_summary.py PROFILE.raw[.xz] [INCLUSIVE_ROWS] > PROFILE.summary.txt

One line per stack, `frame;frame;... count` -> the share of samples each innermost frame holds (self, top 30)
and each function appears in anywhere on the stack (inclusive, counted once per stack, frames of one function
at different lines merged; top INCLUSIVE_ROWS, default 60). The *.summary.txt files under benchmarks/results/
(router profiles of 2026-11-24) were made by this code; the profiles beside them are stored xz-compressed
(`PROFILE.raw.xz`, read as they are).
"""

from __future__ import annotations

import collections
import lzma
import sys
from typing import Iterable

SELF_ROWS = 30


def _function(frame: str) -> str:
    """`name (file.py:123)` -> `name (file.py`: one key per function, whatever line was executing."""
    if " (" not in frame:
        return frame
    name, where = frame.split(" (", 1)
    return f"{name} ({where.split(':')[0]}"


def summarise(lines: Iterable[str], inclusive_rows: int = 60) -> str:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in lines:
        line = line.rstrip()
        if not line:
            continue
        stack, count_text = line.rsplit(" ", 1)
        count = int(count_text)
        total += count
        frames = stack.split(";")
        own[frames[-1]] += count
        for function in dict.fromkeys(_function(f) for f in frames):
            inclusive[function] += count
    out = [f"total samples {total}", f"--- self top {SELF_ROWS}"]
    out += [f"{100 * n / total:5.1f}% {f}" for f, n in own.most_common(SELF_ROWS)]
    out.append(f"--- inclusive top {inclusive_rows}")
    out += [f"{100 * n / total:5.1f}% {f}" for f, n in inclusive.most_common(inclusive_rows)]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    opener = lzma.open if argv[0].endswith(".xz") else open
    with opener(argv[0], "rt") as profile:
        sys.stdout.write(summarise(profile, int(argv[1]) if len(argv) > 1 else 60))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
