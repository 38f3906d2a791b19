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
    cells = lambda row: [row.step, _shown(row.value, "{:.4f}"), _shown(row.stderr, "{:.4f}"), _shown(row.n)]  # noqa: E731
    return _table(headline(rows), getattr, ["step", "value", "stderr", "n"], cells)


def general_average_table(averages: list[dict[str, Any]]) -> str:
    cells = lambda avg: [", ".join(map(str, avg["steps"])), f"{avg['mean']:.4f} ± {avg['std']:.4f}"]  # noqa: E731
    return _table(headline(averages, dict.get), dict.get, ["checkpoints", "mean ± std"], cells)


def _table(items: list, get: Callable[[Any, str], Any], columns: list[str], cells: Callable[[Any], list]) -> str:
    """run, columns[0], task, length (where any item has one), metric, the other columns, shots;
    `cells(item)` gives the columns'."""
    lengths = any(get(item, "length") is not None for item in items)
    header = ["run", columns[0], "task", *["length"] * lengths, "metric", *columns[1:], "shots"]
    table = []
    for item in items:
        first, *more = cells(item)
        task, length, metric = get(item, "task"), get(item, "length"), get(item, "metric")
        label = _metric_label(metric, get(item, "filter"))
        table.append([get(item, "run"), first, task, *[length_text(task, length)] * lengths, label, *more])
        table[-1].append(_shown(get(item, "num_fewshot")))
    return markdown_table(header, table)


def _metric_label(metric: str, filter_name: str | None) -> str:
    return metric if filter_name == "none" else f"{metric} ({filter_name})"


def _shown(value: float | None, form: str = "{}") -> str:
    return "–" if value is None else form.format(value)
