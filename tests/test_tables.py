"""The one table writer: text columns line up whatever the cells' widths; a Markdown cell cannot open a column."""

from __future__ import annotations

from orchestrator.tables import markdown_table, table, text_table

HEAD = ["row", "N", "note"]
ROWS = [["a-long-row-id", "4", "free text"], ["b", "1,024", ""]]


def test_text_columns_start_at_the_same_offset_on_every_line():
    lines = text_table(HEAD, ROWS).splitlines()
    assert len(lines) == 3
    assert {line.index(cells[1]) for line, cells in zip(lines, [HEAD, *ROWS])} == {len("a-long-row-id") + 2}
    assert lines[1].endswith("  free text")
    assert lines[0].startswith("row" + " " * (len("a-long-row-id") - 3 + 2) + "N")


def test_markdown_has_one_separator_and_escapes_a_pipe_inside_a_cell():
    text = markdown_table(HEAD, [["x|y", "2", "z"]])
    assert text.splitlines() == ["| row | N | note |", "|---|---|---|", "| x\\|y | 2 | z |"]
    assert table(HEAD, ROWS, markdown=True) == markdown_table(HEAD, ROWS)
    assert table(HEAD, ROWS) == text_table(HEAD, ROWS)
