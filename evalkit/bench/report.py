"""Benchmark reports as markdown: the table, its exact conditions, the command and the machine."""

from __future__ import annotations

from pathlib import Path

from evalkit.files import atomic_write_text
from evalkit.store.provenance import provenance_lines


def write_report(path: Path, title: str, command: str, conditions: str, table: str, notes: str = "") -> None:
    provenance = "\n".join(provenance_lines())
    text = f"# {title}\n\nCommand: `{command}`\n\nConditions: {conditions}\n\n{provenance}\n\n{table}\n"
    if notes:
        text += f"\n{notes.strip()}\n"
    atomic_write_text(Path(path), text)
