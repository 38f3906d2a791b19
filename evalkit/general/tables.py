"""Averages over a run's checkpoints and markdown tables, from long-form general-task rows. Tables
show what the user asked for (mmlu, not its 57 subjects); the rows and averages on disk keep every member.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evalkit.markdown import markdown_table
from evalkit.store.averages import over_checkpoints
from evalkit.store.result_format import ResultRow, length_text

AVERAGE_KEY = ("run", "requested", "task", "metric", "filter", "num_fewshot", "length")


def run_averages(rows: list[ResultRow]) -> list[dict[str, Any]]:
    """Per run and (requested, task, metric, filter, shots, length): mean and population std over checkpoints,
    with the steps covered: a checkpoint where a task was skipped is absent from it, not a zero."""
    values: dict[tuple, dict[int, float]] = {}
    for row in sorted(rows, key=lambda r: (r.run, r.step)):
        if row.value is not None:
            values.setdefault(tuple(getattr(row, k) for k in AVERAGE_KEY), {})[row.step] = row.value
    averages = []
    for key, by_step in values.items():
        mean, std = over_checkpoints(by_step)
        averages.append(
            {
                **dict(zip(AVERAGE_KEY, key)),
                "mean": mean,
                "std": std,
                "steps": sorted(by_step),
                "num_checkpoints": len(by_step),
            }
        )
    return averages


def headline(rows: list, get: Callable[[Any, str], Any] = getattr) -> list:
    """The rows (or, with get=dict.get, averages) of the names the user asked for; a tag has no
    row of its own: all its tasks."""
    own = {get(row, "requested") for row in rows if get(row, "task") == get(row, "requested")}
    return [row for row in rows if get(row, "task") == get(row, "requested") or get(row, "requested") not in own]


def general_checkpoint_table(rows: list[ResultRow]) -> str:
    rows = headline(rows)
    lengths = any(row.length is not None for row in rows)
    return markdown_table(
        ["run", "step", "task", *["length"] * lengths, "metric", "value", "stderr", "n", "shots"],
        [
            (
                row.run,
                row.step,
                row.task,
                *[length_text(row.task, row.length)] * lengths,
                _metric_label(row.metric, row.filter),
                _shown(row.value, "{:.4f}"),
                _shown(row.stderr, "{:.4f}"),
                _shown(row.n),
                _shown(row.num_fewshot),
            )
            for row in rows
        ],
    )


def general_average_table(averages: list[dict[str, Any]]) -> str:
    shown = headline(averages, dict.get)
    lengths = any(avg["length"] is not None for avg in shown)
    return markdown_table(
        ["run", "checkpoints", "task", *["length"] * lengths, "metric", "mean ± std", "shots"],
        [
            (
                avg["run"],
                ", ".join(str(step) for step in avg["steps"]),
                avg["task"],
                *[length_text(avg["task"], avg["length"])] * lengths,
                _metric_label(avg["metric"], avg["filter"]),
                f"{avg['mean']:.4f} ± {avg['std']:.4f}",
                _shown(avg["num_fewshot"]),
            )
            for avg in shown
        ],
    )


def _metric_label(metric: str, filter_name: str | None) -> str:
    return metric if filter_name == "none" else f"{metric} ({filter_name})"


def _shown(value: float | None, form: str = "{}") -> str:
    return "–" if value is None else form.format(value)
