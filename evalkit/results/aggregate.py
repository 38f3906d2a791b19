"""Averages over stored results: per length over tasks, then over a run's checkpoints.

The paper's recommendation (Fig. 4): RULER swings between nearby checkpoints, so a run is
reported as the mean (and spread) over its last checkpoints of the per-length task average.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass


@dataclass
class RunAverage:
    run: str
    length: int
    mean: float
    std: float  # population std over checkpoints (0 for one checkpoint)
    checkpoints: list[int]
    tasks: list[str]


def per_checkpoint_length_means(rows: list[dict]) -> dict[tuple[str, int, int], tuple[float, list[str]]]:
    """(run, step, length) -> (unweighted mean over tasks, the tasks) from long-form score rows.

    An anchor-encoded row counts under its run and encoding (evalkit.ruler.encoding.series):
    the two encodings of a checkpoint are two series, never averaged together."""
    from evalkit.ruler.encoding import series

    groups: dict[tuple[str, int, int], dict[str, float]] = defaultdict(dict)
    for row in rows:
        groups[(series(row), int(row["step"]), int(row["length"]))][row["task"]] = float(row["score"])
    return {key: (statistics.fmean(scores.values()), sorted(scores)) for key, scores in groups.items()}


def length_averages(rows: list[dict]) -> list[RunAverage]:
    """Per run and length: mean and std over checkpoints of the per-checkpoint task average.

    Checkpoints of one run must have scored the same tasks at a length; a ValueError says which
    differ rather than averaging unlike things.
    """
    by_run: dict[tuple[str, int], list[tuple[int, float, list[str]]]] = defaultdict(list)
    for (run, step, length), (mean, tasks) in per_checkpoint_length_means(rows).items():
        by_run[(run, length)].append((step, mean, tasks))
    averages = []
    for (run, length), entries in sorted(by_run.items()):
        entries.sort()
        task_sets = {tuple(tasks) for _, _, tasks in entries}
        if len(task_sets) > 1:
            raise ValueError(
                f"run {run} at length {length}: its checkpoints scored different task sets {sorted(task_sets)}"
            )
        means = [mean for _, mean, _ in entries]
        averages.append(
            RunAverage(
                run,
                length,
                statistics.fmean(means),
                statistics.pstdev(means),
                [step for step, _, _ in entries],
                list(entries[0][2]),
            )
        )
    return averages
