"""Averages over stored results: per length over tasks, then over a run's checkpoints (the paper's
Fig. 4 advice: RULER swings between nearby checkpoints), and their tables. `over_checkpoints` is the
one mean ± std every average over checkpoints uses.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from evalkit.lengths import length_label
from evalkit.markdown import markdown_table
from evalkit.store.result_format import ResultRow


def over_checkpoints(by_step: dict[int, float]) -> tuple[float, float]:
    """Mean and population std of one score over a run's checkpoints (step -> value): the
    checkpoints are the population reported, not a sample of a larger one (0 for one checkpoint)."""
    values = [by_step[step] for step in sorted(by_step)]
    return statistics.fmean(values), statistics.pstdev(values)


@dataclass
class RunAverage:
    run: str
    length: int
    mean: float
    std: float  # population std over checkpoints (0 for one checkpoint)
    checkpoints: list[int]
    tasks: list[str]


def per_checkpoint_length_means(rows: list[ResultRow]) -> dict[tuple[str, int, int], tuple[float, list[str]]]:
    """(run, step, length) -> (unweighted mean over tasks, the tasks), a row counted under its series
    (ResultRow.series): a checkpoint's two encodings are two series, never averaged together."""
    groups: dict[tuple[str, int, int], dict[str, float]] = defaultdict(dict)
    for row in rows:
        if row.length is None or row.value is None:  # not a row of a length (the docstring's rows have both)
            continue
        groups[(row.series(), row.step, row.length)][row.task] = row.value
    return {key: (statistics.fmean(scores.values()), sorted(scores)) for key, scores in groups.items()}


def length_averages(rows: list[ResultRow], *, same_tasks: bool = True) -> list[RunAverage]:
    """Per run and length: mean and std over checkpoints of the per-checkpoint task average.
    `same_tasks` (--avg): a ValueError names a run whose checkpoints scored different tasks at a
    length rather than average unlike things. The leaderboard shows what is stored (False): the
    average then names the tasks of the checkpoint that scored most."""
    by_run: dict[tuple[str, int], dict[int, tuple[float, list[str]]]] = defaultdict(dict)
    for (run, step, length), (mean, tasks) in per_checkpoint_length_means(rows).items():
        by_run[(run, length)][step] = (mean, tasks)
    averages = []
    for (run, length), by_step in sorted(by_run.items()):
        task_sets = {tuple(tasks) for _, tasks in by_step.values()}
        if same_tasks and len(task_sets) > 1:
            raise ValueError(
                f"run {run} at length {length}: its checkpoints scored different task sets {sorted(task_sets)}"
            )
        mean, std = over_checkpoints({step: value for step, (value, _) in by_step.items()})
        most = max((tasks for _, tasks in by_step.values()), key=len)
        averages.append(RunAverage(run, length, mean, std, sorted(by_step), list(most)))
    return averages


def checkpoint_table(rows: list[ResultRow]) -> str:
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


def average_table(rows: list[ResultRow]) -> str:
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
