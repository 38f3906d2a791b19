"""`evalkit parity`: an engine's forward against the trainer's own, served as trained and stock."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.arglists import parse_list
from evalkit.cli.app import app
from evalkit.files import atomic_write_json, atomic_write_text, check_output_dir
from evalkit.lengths import parse_length


@app.command("parity")
def parity_command(
    ckpt: Path = typer.Argument(..., help="A checkpoint evalkit train wrote (runs/<run>/step-<N>)."),
    engines: str = typer.Option("hf", "--engines", help="hf, vllm, or both comma-separated."),
    length: str = typer.Option("1k", "--length", help="Tokens of the built-in prose to compare on (1k = 1024)."),
    out: Path = typer.Option(None, "--out", help="Directory for parity.md and parity.json."),
) -> None:
    """KL divergence and top-1 agreement of each engine's next-token distributions against the
    trainer's forward on the same tokens, per bucket of positions, served as trained and stock."""
    from evalkit.probe.parity import measure, parity_table
    from evalkit.store.provenance import command_line

    if out is not None:
        check_output_dir(out)
    rows = measure(ckpt, parse_list(engines), parse_length(length))
    table = parity_table(rows)
    typer.echo(table)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "parity.md", f"# Parity: {ckpt}\n\nCommand: `{command_line()}`\n\n{table}\n")
        atomic_write_json(out / "parity.json", {"checkpoint": str(ckpt), "command": command_line(), "rows": rows})
