"""orchestrator/compressed.py: a raw file reads the same as written or xz-compressed."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from orchestrator.compressed import read_text


def test_a_compressed_file_reads_as_the_text_it_was_and_a_plain_one_as_it_is(tmp_path: Path) -> None:
    text = "Decode batch, #running-req: 8 \u00b5s\n" * 1000
    plain, stored = tmp_path / "server.log", tmp_path / "server.log.xz"
    plain.write_text(text)
    stored.write_bytes(lzma.compress(text.encode()))
    assert read_text(stored) == read_text(plain) == text and stored.stat().st_size < plain.stat().st_size / 10


def test_undecodable_bytes_follow_errors_and_a_damaged_archive_raises(tmp_path: Path) -> None:
    stored = tmp_path / "log.xz"
    stored.write_bytes(lzma.compress(b"ok \xff end"))
    assert read_text(stored, errors="replace") == "ok \ufffd end"
    with pytest.raises(UnicodeDecodeError):
        read_text(stored)


@pytest.mark.parametrize("damage", ["truncated", "not xz"])
def test_a_damaged_archive_is_an_oserror_of_one_line_naming_the_file(tmp_path: Path, damage: str) -> None:
    # every reader (report --result, scaling, perfmodel.from_raw and prefill_log) already turns an OSError into its
    # one-line error; lzma's own errors (LZMAError, EOFError for a cut-off stream) are neither OSError nor ValueError
    whole = lzma.compress(b'{"runs": []}\n' * 1000)
    stored = tmp_path / "calibration-x.json.xz"
    stored.write_bytes(whole[: len(whole) // 2] if damage == "truncated" else b"not xz at all")
    with pytest.raises(OSError) as err:
        read_text(stored)
    assert str(stored) in str(err.value) and "\n" not in str(err.value)
