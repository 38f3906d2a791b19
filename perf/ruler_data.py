"""`python -m perf ruler-data`: how fast RULER samples are generated, per task and length.

Generation runs with the disk cache off and a fresh token counter for every (task, length), so
each number includes that task's one-time setup (essay and word-list counts, the demonstration
sizing, the batch's verification by full tokenisation) as a first run would pay it. A task that
cannot be generated here (no QA files, too short a length) gets a row with its reason instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from evalkit.markdown import markdown_table


@dataclass
class RulerDataRow:
    task: str
    length: int
    samples: int
    seconds: float
    samples_per_second: float
    mean_length: float  # mean prompt tokens (BOS and answer prefix included)
    skipped: str = ""  # why no samples were made, when none were


def run(
    tasks: Sequence[str],
    lengths: Sequence[int],
    num_samples: int,
    tokenizer,
    *,
    qa_dir: str | Path | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> list[RulerDataRow]:
    from evalkit.ruler import TaskSkipped, generate
    from evalkit.ruler.generation import forget_counts

    rows = []
    for length in lengths:
        for task in tasks:
            progress(f"{task} at {length}")
            forget_counts(tokenizer)  # no piece counts carried over from the previous task or length
            start = time.perf_counter()
            try:
                samples = generate(task, tokenizer, length, num_samples, qa_dir=qa_dir)  # RULER's seed, 42
            except TaskSkipped as skipped:
                rows.append(RulerDataRow(task, length, 0, 0.0, 0.0, 0.0, skipped.reason))
                continue
            seconds = time.perf_counter() - start
            mean_length = sum(sample.length for sample in samples) / len(samples)
            rows.append(RulerDataRow(task, length, len(samples), seconds, len(samples) / seconds, mean_length))
    return rows


def to_markdown(rows: Sequence[RulerDataRow]) -> str:
    header = ["task", "length", "samples", "seconds", "samples/s", "mean prompt tokens", "note"]
    table = [
        [r.task, r.length, 0, "-", "-", "-", f"skipped: {r.skipped}"]
        if r.skipped
        else [
            r.task,
            r.length,
            r.samples,
            f"{r.seconds:.2f}",
            f"{r.samples_per_second:.0f}",
            f"{r.mean_length:.0f}",
            "",
        ]
        for r in rows
    ]
    return markdown_table(header, table)
