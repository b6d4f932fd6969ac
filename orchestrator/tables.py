"""The one table writer of the reports: a header and rows of cells as column-aligned text or as a Markdown table."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns two spaces apart, each padded to its widest cell; the last column (free text) is not padded."""
    lines = [list(head), *(list(r) for r in rows)]
    widths = [max(len(cells[i]) for cells in lines) for i in range(len(head) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths)) + "  " + cells[-1]
                     for cells in lines)


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; a '|' inside a cell is escaped so it cannot open a column."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(head), "|" + "---|" * len(head), *(line(r) for r in rows)])


def table(head: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool = False) -> str:
    return markdown_table(head, rows) if markdown else text_table(head, rows)
