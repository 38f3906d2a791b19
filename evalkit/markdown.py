"""Markdown tables (the one place that writes a header, its `|---|` separator and the rows) and sections."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_row(cells: Sequence[object]) -> str:
    """One line, `| a | b |`, of a table printed a row at a time (as soon as it is measured)."""
    # A "|" inside a cell would split it in two: escaped, it shows as a pipe. An empty cell is
    # written `| |`, as the tables of evalkit always wrote their empty note column.
    texts = (str(cell).replace("|", "\\|") for cell in cells)
    return "|" + "|".join(f" {text} " if text else " " for text in texts) + "|"


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """The header line, a `|---|---|` separator and one line per row, without a trailing newline.
    Cells go through str() (format numbers first). A row wider or narrower than the header is a
    ValueError: a markdown renderer would silently drop or pad its cells."""
    if not header:
        raise ValueError("a markdown table needs at least one column")
    lines = [markdown_row(header), "|" + "---|" * len(header)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells in a table of {len(header)} columns: {list(row)!r}")
        lines.append(markdown_row(row))
    return "\n".join(lines)


def markdown_section(title: str, *lines: str) -> list[str]:
    """A `## title` section's lines, a blank line after the heading and after the body."""
    return [f"## {title}", "", *lines, ""]
