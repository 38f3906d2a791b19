"""`evalkit compare`: differences between stored evaluations, with their intervals, never re-running."""

from __future__ import annotations

from pathlib import Path

import typer

from evalkit.cli.app import app
from evalkit.errors import UserError
from evalkit.files import atomic_write_json, atomic_write_text, check_output_dir
from evalkit.lengths import parse_lengths


@app.command("compare")
def compare_command(
    paths: list[str] = typer.Argument(
        ...,
        help="Results directories (the --out of evalkit ruler/general), each optionally LABEL=DIR; every run "
        "(and encoding) under them is a series; a LABEL given several runs (LABEL=DIR-seed*) holds them as seeds.",
        show_default=False,
    ),
    baseline: str = typer.Option(
        None,
        "--baseline",
        help="The series every other is compared to (default: the one full-attention series, by its "
        "checkpoints' records; required when there is none or several).",
    ),
    only: str = typer.Option(None, "--series", help="Only these series, comma-separated, in this order."),
    tasks: str = typer.Option(None, "--tasks", help="Only these tasks, comma-separated."),
    lengths: str = typer.Option(None, "--lengths", help="Only these RULER lengths, comma-separated (4k = 4096)."),
    threshold: float = typer.Option(None, "--threshold", help="Effective-length threshold (default: RULER's 85.6)."),
    threshold_from: str = typer.Option(
        None, "--threshold-from", help="Take the threshold from this series' task average at its shortest length."
    ),
    replicates: int = typer.Option(2000, "--replicates", help="Bootstrap replicates."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed (recorded in the output)."),
    pairing: str = typer.Option(
        "auto",
        "--pairing",
        help="auto: paired where the same samples were answered (checked), the same checkpoints or the "
        "same seeds (training streams) were evaluated; require: refuse unpaired samples; independent: never pair.",
    ),
    interactions: list[str] = typer.Option(
        [],
        "--interaction",
        help="A-B:C-D, four series: also (A − B) − (C − D) per cell and task average, from the same replicates "
        "(e.g. full_bf16-full_fp32:anchor_bf16-anchor_fp32); repeatable.",
    ),
    out: Path = typer.Option(None, "--out", help="Directory for compare.md, compare.json and the plot."),
) -> None:
    """Compare stored runs per task and length: B − A with paired or independent intervals, Holm-corrected."""
    from evalkit.results import compare_report
    from evalkit.results.compare import RULER_THRESHOLD, compare, default_baseline
    from evalkit.results.samples import load_series
    from evalkit.results.summaries import not_read_note
    from evalkit.store.provenance import command_line

    if threshold is not None and threshold_from is not None:
        raise UserError("give --threshold or --threshold-from, not both")
    if out is not None:
        check_output_dir(out)
    unread: list[str] = []
    series = load_series(paths, unread)
    if unread:
        typer.echo(not_read_note(unread), err=True)
    order = list(series)
    if only:
        order = [name.strip() for name in only.split(",") if name.strip()]
        unknown = [name for name in order if name not in series]
        if unknown:
            raise UserError(f"--series {', '.join(unknown)}: not found; the series are: {', '.join(series)}")
        twice = sorted({name for name in order if order.count(name) > 1})
        if twice:
            raise UserError(f"--series names {', '.join(twice)} twice; name each series once (at least two)")
    if baseline is None and len(order) >= 2:  # fewer: compare's own error says so
        baseline = default_baseline({name: series[name] for name in order})
    if tasks or lengths:
        wanted_tasks = {task.strip() for task in tasks.split(",")} if tasks else None
        wanted_lengths = set(parse_lengths(lengths)) if lengths else None
        for one in series.values():
            for cells in (cells for run in one.members() for cells in run.checkpoints.values()):
                for cell in list(cells):
                    if (wanted_tasks and cell.task not in wanted_tasks) or (
                        wanted_lengths and cell.length is not None and cell.length not in wanted_lengths
                    ):
                        del cells[cell]
    chosen = {name: series[name] for name in order}
    if threshold_from is not None and threshold_from not in chosen and threshold_from in series:
        chosen[threshold_from] = series[threshold_from]
    result = compare(chosen, order, baseline=baseline, replicates=replicates, seed=seed, pairing=pairing,
                     threshold=RULER_THRESHOLD if threshold is None else threshold, threshold_from=threshold_from,
                     interactions=tuple(interactions))  # fmt: skip
    command = command_line()
    text = compare_report.markdown(result, command)
    if unread:
        text += "\n## " + not_read_note(unread) + "\n"
    typer.echo(text)
    if out is not None:
        atomic_write_json(out / "compare.json", compare_report.json_records(result, command))
        figures = compare_report.plot(result, out / "compare-vs-length")
        if figures:
            text += f"\n![difference vs length]({figures[0].name})\n"
        atomic_write_text(out / "compare.md", text)
        typer.echo(f"wrote {out / 'compare.md'}, compare.json and the plot", err=True)
