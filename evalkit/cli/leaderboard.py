"""`evalkit leaderboard`: tables and plots from stored results, never re-running."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.cli.app import app
from evalkit.errors import UserError
from evalkit.files import check_output_dir, check_output_file


@app.command("leaderboard")
def leaderboard_command(
    dirs: list[Path] = typer.Argument(
        None, help="Results directories (default: results/ruler and results/general).", show_default=False
    ),
    out: Path = typer.Option(Path("results/leaderboard.md"), "--out", help="The markdown file to write."),
    plots: Path = typer.Option(None, "--plots", help="Directory for the PNG/SVG plots (default: plots/ beside --out)."),
    form: str = typer.Option(
        "md",
        "--format",
        help="md: the tables and plots; csv or json: every stored number as a long-form row of the result schema "
        "(default --out then ends in .csv/.json).",
    ),
    threshold: float = typer.Option(None, "--threshold", help="Effective-length threshold (default: RULER's 85.6)."),
    threshold_from: str = typer.Option(
        None, "--threshold-from", help="Take the threshold from this run's task average at its shortest length."
    ),
) -> None:
    """Write leaderboards and plots from stored results, never re-running."""
    from evalkit.results.leaderboard import check_leaderboard_outputs, write_export, write_leaderboard
    from evalkit.results.summaries import not_read_note

    if form not in ("md", "csv", "json"):
        raise UserError(f"--format must be md, csv or json, got {form!r}")
    if threshold is not None and threshold_from is not None:
        raise UserError("give --threshold or --threshold-from, not both")

    chosen = dirs or [d for d in (Path("results/ruler"), Path("results/general")) if d.is_dir()]
    if not chosen:
        raise UserError("no results directory given and neither results/ruler nor results/general exists")
    for directory in chosen:
        if not directory.is_dir():
            raise UserError(f"results directory {directory} does not exist")
    if form != "md" and out == Path("results/leaderboard.md"):
        out = out.with_suffix(f".{form}")
    check_output_file(out)
    if form != "md":
        unread: list[str] = []
        written = write_export(chosen, out, form, unread)
        if unread:
            typer.echo(not_read_note(unread), err=True)
        typer.echo(f"wrote {written}", err=True)
        return
    check_output_dir(plots or out.parent / "plots", "--plots")
    check_leaderboard_outputs(out, plots)
    board = write_leaderboard(chosen, out, plots, threshold, threshold_from)
    typer.echo(board.read_text())
    typer.echo(f"wrote {board} and its plots in {plots or board.parent / 'plots'}", err=True)
