"""Markdown tables from stored RULER summaries."""

from __future__ import annotations

from evalkit.lengths import length_label
from evalkit.markdown import markdown_table
from evalkit.results.aggregate import length_averages, per_checkpoint_length_means


def checkpoint_table(rows: list[dict]) -> str:
    """One row per checkpoint: the task average at each length, and their mean."""
    means = per_checkpoint_length_means(rows)
    lengths = sorted({length for _, _, length in means})
    table = []
    for run, step in sorted({(run, step) for run, step, _ in means}):
        cells = [means.get((run, step, n)) for n in lengths]
        values = [cell[0] for cell in cells if cell is not None]
        text = [f"{cell[0]:.2f}" if cell else "–" for cell in cells]
        avg = f"{sum(values) / len(values):.2f}" if values else "–"
        table.append([run, step, *text, avg])
    return markdown_table(["run", "step", *map(length_label, lengths), "avg"], table)


def average_table(rows: list[dict]) -> str:
    """One row per run: mean ± std over its checkpoints of the per-length task average."""
    averages = length_averages(rows)
    lengths = sorted({a.length for a in averages})
    table = []
    for run in sorted({a.run for a in averages}):
        by_length = {a.length: a for a in averages if a.run == run}
        steps = sorted({s for a in by_length.values() for s in a.checkpoints})
        cells = [f"{by_length[n].mean:.2f} ± {by_length[n].std:.2f}" if n in by_length else "–" for n in lengths]
        means = [a.mean for a in by_length.values()]
        table.append([run, ", ".join(map(str, steps)), *cells, f"{sum(means) / len(means):.2f}"])
    return markdown_table(["run", "checkpoints", *map(length_label, lengths), "avg"], table)
