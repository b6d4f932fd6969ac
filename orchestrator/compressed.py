"""A committed raw file's text, whether it is stored as written or xz-compressed as `NAME.xz`.

benchmarks/results/ keeps its large logs and JSON compressed (every device call carries the tracked tree within 64 MiB),
so the readers of raw files (`report --result`, `scaling`, `perfmodel.from_raw`, `perfmodel.prefill_log`) take either.
"""

from __future__ import annotations

import lzma
from pathlib import Path


def read_text(path: str | Path, errors: str | None = None) -> str:
    """The file's text; a name ending in .xz is decompressed. A damaged or cut-off archive raises an OSError naming
    the file, the error every reader already turns into its one line (lzma's own are neither OSError nor ValueError)."""
    path = Path(path)
    if path.suffix == ".xz":
        try:
            with lzma.open(path, "rt", errors=errors) as stored:
                return stored.read()
        except (lzma.LZMAError, EOFError) as exc:
            raise OSError(f"{path}: not a whole xz archive ({exc}); restore the file or pass its uncompressed copy") from None
    return path.read_text(errors=errors)
