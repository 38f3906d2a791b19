"""Averages over stored results: per length over tasks, then over a run's checkpoints (the paper's
Fig. 4 advice: RULER swings between nearby checkpoints), and their tables. `over_checkpoints` is the
one mean ± std every average over checkpoints uses. The tasks averaged are a category's: RULER's
13 (those scored), or HELMET's Recall (its four, only where all four are scored).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from evalkit.lengths import length_label
from evalkit.markdown import markdown_table
from evalkit.store.result_format import ResultRow


@dataclass(frozen=True)
class Category:
    """Tasks averaged per length; `complete`: only where every one of them is scored."""

    name: str
    tasks: tuple[str, ...]
    complete: bool = False


# The tasks' names are defined here, below the benchmarks, so that store/ and results/ average by them
# without importing one; evalkit/ruler/spec.py takes its task list and --tasks group from them.
RULER = Category("RULER", (  # NVIDIA's 13, in its order (scripts/synthetic.yaml)
    "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
    "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2",
))  # fmt: skip
HELMET_RECALL = Category(  # HELMET's configs/recall.yaml
    "HELMET Recall", ("niah_multikey_2", "niah_multikey_3", "niah_multivalue", "json_kv"), complete=True
)


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
    category: str | None = None  # Category.name (None: every task's rows)


def per_checkpoint_length_means(
    rows: list[ResultRow], category: Category | None = None
) -> dict[tuple[str, int, int], tuple[float, list[str]]]:
    """(run, step, length) -> (unweighted mean over the category's tasks, the tasks; None: over every
    task), a row counted under its series (ResultRow.series): a checkpoint's two encodings are two
    series, never averaged together."""
    groups: dict[tuple[str, int, int], dict[str, float]] = defaultdict(dict)
    for row in rows:
        if row.length is None or row.value is None:  # not a row of a length (the docstring's rows have both)
            continue
        if category is None or row.task in category.tasks:
            groups[(row.series(), row.step, row.length)][row.task] = row.value
    if category is not None and category.complete:
        groups = {key: scores for key, scores in groups.items() if len(scores) == len(category.tasks)}
    return {key: (statistics.fmean(scores.values()), sorted(scores)) for key, scores in groups.items()}


def shown_categories(rows: list[ResultRow]) -> list[Category | None]:
    """The categories with an average in `rows`; none of them: [None] (tasks of no category, json_kv alone)."""
    return [category for category in (RULER, HELMET_RECALL) if per_checkpoint_length_means(rows, category)] or [None]


def category_averages(rows: list[ResultRow]) -> list[RunAverage]:
    """--avg's records: each shown category's length_averages."""
    return [average for category in shown_categories(rows) for average in length_averages(rows, category=category)]


def length_averages(
    rows: list[ResultRow], *, same_tasks: bool = True, category: Category | None = None
) -> list[RunAverage]:
    """Per run and length: mean and std over checkpoints of the per-checkpoint task average.
    `same_tasks` (--avg): a ValueError names a run whose checkpoints scored different tasks at a
    length rather than average unlike things. The leaderboard shows what is stored (False): the
    average then names the tasks of the checkpoint that scored most."""
    by_run: dict[tuple[str, int], dict[int, tuple[float, list[str]]]] = defaultdict(dict)
    for (run, step, length), (mean, tasks) in per_checkpoint_length_means(rows, category).items():
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
        averages.append(
            RunAverage(run, length, mean, std, sorted(by_step), list(most), category.name if category else None)
        )
    return averages


def _per_category(rows: list[ResultRow], table) -> str:
    """RULER's table, then each other category's under its name."""
    return "\n\n".join(
        table(rows, category)
        if category in (RULER, None)
        else f"{category.name} ({', '.join(category.tasks)}):\n\n{table(rows, category)}"
        for category in shown_categories(rows)
    )


def checkpoint_table(rows: list[ResultRow]) -> str:
    return _per_category(rows, _checkpoint_table)


def average_table(rows: list[ResultRow]) -> str:
    return _per_category(rows, _average_table)


def _checkpoint_table(rows: list[ResultRow], category: Category | None) -> str:
    means = per_checkpoint_length_means(rows, category)
    lengths = sorted({length for _, _, length in means})
    table = []
    for run, step in sorted({(run, step) for run, step, _ in means}):
        cells = [means.get((run, step, n)) for n in lengths]
        values = [cell[0] for cell in cells if cell is not None]
        text = [f"{cell[0]:.2f}" if cell else "–" for cell in cells]
        avg = f"{sum(values) / len(values):.2f}" if values else "–"
        table.append([run, step, *text, avg])
    return markdown_table(["run", "step", *map(length_label, lengths), "avg"], table)


def _average_table(rows: list[ResultRow], category: Category | None) -> str:
    averages = length_averages(rows, category=category)
    lengths = sorted({a.length for a in averages})
    table = []
    for run in sorted({a.run for a in averages}):
        by_length = {a.length: a for a in averages if a.run == run}
        steps = sorted({s for a in by_length.values() for s in a.checkpoints})
        cells = [f"{by_length[n].mean:.2f} ± {by_length[n].std:.2f}" if n in by_length else "–" for n in lengths]
        means = [a.mean for a in by_length.values()]
        table.append([run, ", ".join(map(str, steps)), *cells, f"{sum(means) / len(means):.2f}"])
    return markdown_table(["run", "checkpoints", *map(length_label, lengths), "avg"], table)
