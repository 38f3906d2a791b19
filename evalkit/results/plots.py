"""Leaderboard plots (PNG and SVG), each from the values the leaderboard's tables computed, never rows."""

from __future__ import annotations

from pathlib import Path

from evalkit.figures import new_figure, write_figure
from evalkit.lengths import length_label


def ruler_vs_length(cells: dict[tuple[str, int], tuple[float, float]], stem: Path) -> list[Path]:
    """One line per run, the band one std either side (`cells`: (run, length) -> (mean, std))."""
    import numpy as np

    figure, axes = new_figure()
    for run in sorted({run for run, _ in cells}):
        lengths = sorted(n for r, n in cells if r == run)
        means, stds = np.array([cells[(run, n)] for n in lengths]).T
        (line,) = axes.plot(lengths, means, marker="o", label=run)
        axes.fill_between(lengths, means - stds, means + stds, color=line.get_color(), alpha=0.2)
    length_axis(axes, {n for _, n in cells})
    axes.set(ylabel="RULER score (task average)", ylim=(-2, 102),
             title="RULER vs context length (band: spread over checkpoints)")  # fmt: skip
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    return write_figure(figure, stem)


def length_axis(axes, lengths: set[int]) -> None:
    axes.set_xscale("log", base=2)
    axes.set_xticks(sorted(lengths), [length_label(n) for n in sorted(lengths)])
    axes.minorticks_off()
    axes.set(xlabel="context length (tokens)")


def ruler_vs_step(per_step: dict[str, dict[int, float]], stem: Path) -> list[Path]:
    """The paper's Fig. 4 view (`per_step`: run -> step -> the checkpoint's RULER average)."""
    figure, axes = new_figure()
    _by_step(axes, per_step, "RULER score (average over lengths)", "RULER across a run's checkpoints")
    axes.set(ylim=(-2, 102))
    return write_figure(figure, stem)


def ruler_and_ppl_vs_step(
    ruler: dict[str, dict[int, float]], ppl: dict[str, dict[int, float]], stem: Path
) -> list[Path]:
    """Fig. 4 whole: RULER's average (left) and perplexity (right) against the step, one line per run."""
    figure, (left, right) = new_figure(11, columns=2)
    _by_step(left, ruler, "RULER score (average over lengths)", "RULER across a run's checkpoints")
    _by_step(right, ppl, "perplexity (mean over lengths)", "Perplexity across a run's checkpoints")
    return write_figure(figure, stem)


def _by_step(axes, per_step: dict[str, dict[int, float]], ylabel: str, title: str) -> None:
    for run in sorted(per_step):
        steps = sorted(per_step[run])
        axes.plot(steps, [per_step[run][s] for s in steps], marker="o", label=run)
    axes.set(xlabel="training step", ylabel=ylabel, title=title)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)


def general_bars(values: dict[tuple[str, str], tuple[float, float | None]], stem: Path) -> list[Path]:
    """Grouped bars: one group per task/metric, one bar per run, stderr whiskers (leaderboard.benchmark_cells)."""
    columns = sorted({c for _, c in values})
    runs = sorted({r for r, _ in values})
    figure, axes = new_figure(max(6.4, 1.2 * len(columns) * max(1, len(runs)) / 2))
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        present = [(j, values[(run, column)]) for j, column in enumerate(columns) if (run, column) in values]
        xs = [j + i * width for j, _ in present]
        heights = [mean for _, (mean, _) in present]
        errors = [error or 0.0 for _, (_, error) in present]
        axes.bar(xs, heights, width=width, yerr=errors, capsize=3, label=run)
    axes.set_xticks([j + 0.4 - width / 2 for j in range(len(columns))], columns, fontsize=7)
    axes.set(ylabel="score", title="General tasks (mean over checkpoints; whiskers: stderr)")
    axes.legend(fontsize=8)
    return write_figure(figure, stem)


def depth_heatmaps(grids: dict[str, dict[tuple[int, int], float]], stem: Path, difference: bool = False) -> list[Path]:
    """One panel per run (or paradigm difference): needle depth down, length across, each cell's value
    written in it (`grids`: name -> (depth bucket, length) -> percent, as the depth tables show them)."""
    import numpy as np
    from matplotlib.figure import Figure

    from evalkit.results.depth import BUCKETS, bucket_label

    names = sorted(grids)
    columns = min(3, len(names))
    figure = Figure(figsize=(max(6.4, 4.4 * columns), 4.0 * -(-len(names) // columns)))
    panels = figure.subplots(-(-len(names) // columns), columns, squeeze=False).ravel()
    extreme = max([1.0, *(abs(v) for grid in grids.values() for v in grid.values())])
    for axes, name in zip(panels, names):
        lengths = sorted({n for _, n in grids[name]})
        values = np.full((BUCKETS, len(lengths)), np.nan)
        for (bucket, n), value in grids[name].items():
            values[bucket, lengths.index(n)] = value
        shown = dict(cmap="RdBu", vmin=-extreme, vmax=extreme) if difference else dict(cmap="RdYlGn", vmin=0, vmax=100)
        axes.imshow(values, aspect="auto", **shown)
        for (row, column), value in np.ndenumerate(values):
            if not np.isnan(value):  # white on the darkest colours
                dark = abs(value) > 0.6 * extreme if difference else not 15 < value < 85
                text = f"{value:+.0f}" if difference else f"{value:.0f}"
                axes.text(column, row, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
        axes.set_xticks(range(len(lengths)), [length_label(n) for n in lengths])
        axes.set_yticks(range(BUCKETS), [bucket_label(b) for b in range(BUCKETS)], fontsize=7)
        axes.set(xlabel="context length (tokens)", ylabel="needle depth")
        axes.set_title(name if len(name) < 48 else name[:45] + "…", fontsize=8)
    for axes in panels[len(names) :]:
        axes.set_visible(False)
    figure.suptitle(
        "niah: paradigm differences in % of references found (percentage points)"
        if difference
        else "niah: % of references found by needle depth (mean over checkpoints)",
        fontsize=11,
    )
    return write_figure(figure, stem)


def long_context(board: dict[tuple[str, str], dict[str, dict[int, float]]], stem: Path) -> list[Path]:
    """The long-context board (leaderboard.long_context_board): one panel per benchmark, its lengths
    evenly spaced (BABILong's 0K and LongBench-E's word buckets have no place on a log axis)."""
    from evalkit.store.result_format import LONGBENCH_E_BUCKETS

    figure, panels = new_figure(4.2 * len(board), columns=len(board))
    for axes, ((label, axis), runs) in zip(panels, board.items()):  # the leaderboard draws two or more
        lengths = sorted({n for cells in runs.values() for n in cells})
        for run in sorted(runs):
            shown = [n for n in lengths if n in runs[run]]
            axes.plot([lengths.index(n) for n in shown], [runs[run][n] for n in shown], marker="o", label=run)
        names = [LONGBENCH_E_BUCKETS[n] if axis == "words" else length_label(n) for n in lengths]
        axes.set_xticks(range(len(lengths)), names)
        axes.set(title=label, xlabel=f"context length ({axis})")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=7)
    return write_figure(figure, stem)
