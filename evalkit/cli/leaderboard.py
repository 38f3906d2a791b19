"""`evalkit leaderboard`: tables and plots from stored results, never re-running."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.cli.app import app
from evalkit.errors import UserError
from evalkit.storage import check_output_dir, check_output_file


@app.command("leaderboard")
def leaderboard_command(
    dirs: list[Path] = typer.Argument(
        None, help="Results directories (default: results/ruler and results/general).", show_default=False
    ),
    out: Path = typer.Option(Path("results/leaderboard.md"), "--out", help="The markdown file to write."),
    plots: Path = typer.Option(None, "--plots", help="Directory for the PNG/SVG plots (default: plots/ beside --out)."),
) -> None:
    """Write leaderboards and plots from stored results, never re-running."""
    from evalkit.results.leaderboard import check_leaderboard_outputs, write_leaderboard

    chosen = dirs or [d for d in (Path("results/ruler"), Path("results/general")) if d.is_dir()]
    if not chosen:
        raise UserError("no results directory given and neither results/ruler nor results/general exists")
    for directory in chosen:
        if not directory.is_dir():
            raise UserError(f"results directory {directory} does not exist")
    check_output_file(out)
    check_output_dir(plots or out.parent / "plots", "--plots")
    check_leaderboard_outputs(out, plots)
    board = write_leaderboard(chosen, out, plots)
    typer.echo(board.read_text())
    typer.echo(f"wrote {board} and its plots in {plots or board.parent / 'plots'}", err=True)
