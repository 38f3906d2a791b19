"""Compare two stored RULER evaluations of one checkpoint, task by task, at one length.

    python scripts/compare_ruler_runs.py RUN_A RUN_B --length 4096 [--names exact,nvidia] [--tasks T1,T2]

RUN_A and RUN_B are `<out>/<run>/step-<N>` directories written by `evalkit ruler` (for example
the same checkpoint under `--sizing exact` and `--sizing nvidia`), or comma-separated lists of
as many such directories each, pooled: the k-th of A pairs with the k-th of B (for example
evaluations with another --seed, which draws other samples). Reads only the per-sample
logs, never re-runs anything. For each task both have: samples, how full the prompts are (mean
prompt tokens over length minus the generation budget), score ± standard error, and the
difference B − A with its standard error. When every sample index both logs hold carries the
same references (the same seed: the two sizings draw the same needles and questions and differ
only in how much haystack surrounds them) the difference is paired: the mean of the per-sample
score differences, its error their standard deviation over the square root of n. Otherwise the
two sets are independent draws and the errors add in quadrature. The average over tasks
combines the tasks' errors as independent. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from evalkit.ruler.metrics import score, standard_error
from evalkit.ruler.spec import task_spec


def read_task(runs: list[Path], task: str, length: int) -> dict[tuple[int, int], dict]:
    """The task's records in every directory, keyed by (the directory's place, sample index)."""
    found = {}
    for place, run in enumerate(runs):
        log = run / "ruler" / task / f"{length}.jsonl"
        if log.is_file():
            for line in log.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    record = json.loads(line)
                    found[place, int(record["index"])] = record
    return found


@dataclass
class TaskComparison:
    task: str
    cells: list[str]  # "n | fill | score ± error" for A, then B
    score_a: float
    score_b: float
    difference: float
    error: float
    paired: bool


def _cell(task: str, budget: int, records: list[dict]) -> tuple[str, float, float]:
    predictions = [r["prediction"] for r in records]
    references = [r["references"] for r in records]
    value, error = score(task, predictions, references), standard_error(task, predictions, references)
    fill = sum(r["length"] for r in records) / len(records) / budget
    return f"{len(records)} | {fill:.2f} | {value:.1f} ± {error:.1f}", value, error


def compare_task(task: str, length: int, a: dict, b: dict) -> TaskComparison:
    budget = length - task_spec(task).max_new_tokens
    shared = sorted(set(a) & set(b))
    paired = len(shared) > 1 and all(a[i]["references"] == b[i]["references"] for i in shared)
    if paired:  # the same samples, differently sized: compare them one by one
        a_records, b_records = [a[i] for i in shared], [b[i] for i in shared]
    else:
        a_records, b_records = [a[i] for i in sorted(a)], [b[i] for i in sorted(b)]
    cell_a, value_a, error_a = _cell(task, budget, a_records)
    cell_b, value_b, error_b = _cell(task, budget, b_records)
    if paired:
        differences = [float(y["score"]) - float(x["score"]) for x, y in zip(a_records, b_records)]
        error = statistics.stdev(differences) / math.sqrt(len(differences))
    else:
        error = math.hypot(error_a, error_b)
    return TaskComparison(task, [cell_a, cell_b], value_a, value_b, value_b - value_a, error, paired)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", help="One checkpoint's results directory, or several, comma-separated.")
    parser.add_argument("run_b", help="As many directories as run_a, in the same order.")
    parser.add_argument("--length", type=int, required=True)
    parser.add_argument("--names", default="A,B", help="Column names of the two runs, comma-separated.")
    parser.add_argument("--tasks", help="Only these tasks, comma-separated (default: every task both hold).")
    args = parser.parse_args()
    name_a, name_b = args.names.split(",")
    runs_a, runs_b = [Path(p) for p in args.run_a.split(",")], [Path(p) for p in args.run_b.split(",")]
    if len(runs_a) != len(runs_b):
        parser.error(f"run_a names {len(runs_a)} directories and run_b {len(runs_b)}: give as many of each")
    tasks = sorted(
        {p.name for run in runs_a for p in (run / "ruler").iterdir()}
        & {p.name for run in runs_b for p in (run / "ruler").iterdir()}
    )
    if args.tasks:
        tasks = [task for task in tasks if task in args.tasks.split(",")]
    print(
        f"| task | n ({name_a}) | fill ({name_a}) | score ({name_a}) | n ({name_b}) | fill ({name_b}) "
        f"| score ({name_b}) | {name_b} − {name_a} | paired |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    compared = []
    for task in tasks:
        a, b = read_task(runs_a, task, args.length), read_task(runs_b, task, args.length)
        if not a or not b:
            continue
        row = compare_task(task, args.length, a, b)
        compared.append(row)
        print(
            f"| {task} | {row.cells[0]} | {row.cells[1]} | {row.difference:+.1f} ± {row.error:.1f} "
            f"| {'yes' if row.paired else 'no'} |"
        )
    if compared:
        count = len(compared)
        mean_a = statistics.fmean(row.score_a for row in compared)
        mean_b = statistics.fmean(row.score_b for row in compared)
        error = math.sqrt(sum(row.error**2 for row in compared)) / count
        print(
            f"| **average ({count} tasks)** | | | **{mean_a:.2f}** | | | **{mean_b:.2f}** "
            f"| **{mean_b - mean_a:+.2f} ± {error:.2f}** | |"
        )


if __name__ == "__main__":
    main()
