"""Markdown tables: the one place that writes a header, its `|---|` separator and the rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def _cell(value: object) -> str:
    # A "|" inside a cell would split it in two; escaped, it shows as a pipe.
    text = str(value).replace("|", "\\|")
    # An empty cell is written `| |`, as the tables of evalkit always wrote their empty note column.
    return f" {text} " if text else " "


def markdown_row(cells: Sequence[object]) -> str:
    """One table line, `| a | b |`: each cell through str(), a "|" in it escaped as "\\|".

    For a table printed a line at a time (a row as soon as it is measured); otherwise use
    markdown_table, which also checks each row's width against the header."""
    return "|" + "|".join(_cell(cell) for cell in cells) + "|"


def markdown_table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table: the header line, a `|---|---|` separator, then one line per row.

    Cells are converted with str() (format numbers before passing them) and a "|" in a cell is
    escaped as "\\|". No trailing newline. A row with more or fewer cells than the header is a
    ValueError: a markdown renderer would silently drop or pad its cells.

    >>> print(markdown_table(["run", "score"], [["a", "1.50"], ["b", 2]]))
    | run | score |
    |---|---|
    | a | 1.50 |
    | b | 2 |
    """
    if not header:
        raise ValueError("a markdown table needs at least one column")
    lines = [markdown_row(header), "|" + "---|" * len(header)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells in a table of {len(header)} columns: {list(row)!r}")
        lines.append(markdown_row(row))
    return "\n".join(lines)
