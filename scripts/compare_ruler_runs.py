"""Compare two stored RULER evaluations of one checkpoint, task by task, at one length.

    python scripts/compare_ruler_runs.py RUN_A RUN_B --length 4096 [--names exact,nvidia]

RUN_A and RUN_B are `<out>/<run>/step-<N>` directories written by `evalkit ruler` (for example
the same checkpoint under `--sizing exact` and `--sizing nvidia`). Reads only the per-sample
logs, never re-runs anything. For each task both have: samples, how full the prompts are (mean
prompt tokens over length minus the generation budget), score ± standard error, and the
difference with its standard error (the two sample sets are independent draws, so the errors
add in quadrature). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from evalkit.ruler.metrics import score, standard_error
from evalkit.ruler.spec import task_spec


def read_task(run: Path, task: str, length: int) -> list[dict] | None:
    log = run / "ruler" / task / f"{length}.jsonl"
    if not log.is_file():
        return None
    records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted(records, key=lambda record: record["index"])


def task_row(task: str, length: int, a: list[dict], b: list[dict]) -> tuple[str, float, float, float]:
    budget = length - task_spec(task).max_new_tokens
    cells = []
    scores = []
    for records in (a, b):
        predictions = [r["prediction"] for r in records]
        references = [r["references"] for r in records]
        value, error = score(task, predictions, references), standard_error(task, predictions, references)
        fill = sum(r["length"] for r in records) / len(records) / budget
        cells.append(f"{len(records)} | {fill:.2f} | {value:.1f} ± {error:.1f}")
        scores.append((value, error))
    (value_a, error_a), (value_b, error_b) = scores
    difference, difference_error = value_b - value_a, math.hypot(error_a, error_b)
    line = f"| {task} | {cells[0]} | {cells[1]} | {difference:+.1f} ± {difference_error:.1f} |"
    return line, value_a, value_b, difference_error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path)
    parser.add_argument("run_b", type=Path)
    parser.add_argument("--length", type=int, required=True)
    parser.add_argument("--names", default="A,B", help="Column names of the two runs, comma-separated.")
    args = parser.parse_args()
    name_a, name_b = args.names.split(",")
    tasks = sorted(
        {p.name for p in (args.run_a / "ruler").iterdir()} & {p.name for p in (args.run_b / "ruler").iterdir()}
    )
    print(
        f"| task | n ({name_a}) | fill ({name_a}) | score ({name_a}) | n ({name_b}) | fill ({name_b}) "
        f"| score ({name_b}) | {name_b} − {name_a} |"
    )
    print("|---|---|---|---|---|---|---|---|")
    means_a, means_b = [], []
    for task in tasks:
        a, b = read_task(args.run_a, task, args.length), read_task(args.run_b, task, args.length)
        if not a or not b:
            continue
        line, value_a, value_b, _ = task_row(task, args.length, a, b)
        print(line)
        means_a.append(value_a)
        means_b.append(value_b)
    if means_a:
        mean_a, mean_b = sum(means_a) / len(means_a), sum(means_b) / len(means_b)
        print(
            f"| **average ({len(means_a)} tasks)** | | | **{mean_a:.2f}** | | | **{mean_b:.2f}** "
            f"| **{mean_b - mean_a:+.2f}** |"
        )


if __name__ == "__main__":
    main()
