"""Benchmark reports as markdown: the table, its exact conditions, the command and the machine."""

from __future__ import annotations

from pathlib import Path

from evalkit.provenance import stamp
from evalkit.results_io import atomic_write_text


def write_report(path: Path, title: str, command: str, conditions: str, table: str, notes: str = "") -> None:
    info = stamp()
    machine = info["machine"]
    machine_line = ", ".join(f"{k} {v}" for k, v in machine.items())
    text = (
        f"# {title}\n\n"
        f"Command: `{command}`\n\n"
        f"Conditions: {conditions}\n\n"
        f"Machine: {machine_line}\n\n"
        f"evalkit {info['evalkit_version']} ({info['git_hash']}), {info['created']}\n\n"
        f"{table}\n"
    )
    if notes:
        text += f"\n{notes.strip()}\n"
    atomic_write_text(Path(path), text)
