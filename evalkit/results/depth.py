"""Where the needle was: niah accuracy by needle depth × length, from the sample logs' `depths`
(docs/leaderboards.md)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.errors import UserError
from evalkit.lengths import length_label
from evalkit.markdown import markdown_table
from evalkit.results.samples import read_log
from evalkit.results.summaries import RULER_SUMMARY, summary_files
from evalkit.store.result_format import STANDARD, summary_rows

BUCKETS = 10  # 0-10%, ..., 90-100%; a needle at 100% falls in the last
Cell = tuple[int, int]  # (depth bucket, length)


@dataclass
class DepthRun:
    """One series' (a run's, or its run under another encoding) accuracy by depth bucket and length."""

    group: tuple[str, str, str]  # model, training data, encoding: runs a paradigm difference compares
    paradigm: str
    tallies: dict[int, dict[Cell, list[int]]] = field(default_factory=dict)  # step -> cell -> [found, references]

    def grid(self) -> dict[Cell, float]:
        """Percent found per cell: per checkpoint, then the mean over the checkpoints that have it (as --avg)."""
        tallies = self.tallies.values()
        return {cell: statistics.fmean(100 * c[cell][0] / c[cell][1] for c in tallies if cell in c)
                for cell in set().union(*tallies)}  # fmt: skip

    def references(self) -> dict[Cell, int]:
        """References per cell of one checkpoint (the most of any)."""
        tallies = self.tallies.values()
        return {cell: max(c[cell][1] for c in tallies if cell in c) for cell in set().union(*tallies)}


def depth_runs(dirs: list[Path]) -> dict[str, DepthRun]:
    """Every series with a niah record that has depths under `dirs` (RULER's summaries and their logs)."""
    runs: dict[str, DepthRun] = {}
    for path, summary in summary_files(dirs, RULER_SUMMARY):
        for row in summary_rows(summary):
            label, length = row.encoding_label() or STANDARD, row.length
            name = f"{length}.jsonl" if label == STANDARD else f"{length}.{label}.jsonl"
            log = path.parent / "ruler" / row.task / name
            if not row.task.startswith("niah") or length is None or not log.is_file():
                continue
            run = runs.setdefault(row.series(), DepthRun((row.model, row.data, label), row.paradigm))
            cells = run.tallies.setdefault(int(summary["step"]), {})
            for record in read_log(log):
                if "depths" in record and (row.n is None or int(record["index"]) < row.n):
                    _tally(cells, record, length, log)
    return {name: run for name, run in runs.items() if any(run.tallies.values())}


def _tally(cells: dict[Cell, list[int]], record: dict, length: int, log: Path) -> None:
    # found as string_match_all finds it: its clean-up of control characters changes nothing for
    # niah's digits and UUIDs, and the count is checked against the stored score
    prediction = record["prediction"].lower()
    found = [reference.lower() in prediction for reference in record["references"]]
    if abs(100 * sum(found) / len(found) - record["score"]) > 1e-6:
        raise UserError(f"{log}: sample {record['index']}'s references found do not give its score; rerun it")
    for depth, hit in zip(record["depths"], found, strict=True):
        tally = cells.setdefault((min(int(depth * BUCKETS // 100), BUCKETS - 1), length), [0, 0])
        tally[0] += hit
        tally[1] += 1


def differences(runs: dict[str, DepthRun]) -> dict[str, dict[Cell, float]]:
    """Per paradigm, minus the baseline paradigm (full attention where there is one, as compare's
    default baseline), among runs of one model, training data and encoding: the mean over the
    paradigm's runs of their grids minus the baseline's, where both have the cell."""
    grouped: dict[tuple, dict[str, list[dict[Cell, float]]]] = defaultdict(lambda: defaultdict(list))
    for run in runs.values():
        grouped[run.group][run.paradigm].append(run.grid())
    found = {}
    for (model, data, encoding), paradigms in sorted(grouped.items()):
        base = "full" if "full" in paradigms else min(paradigms)
        # per cell, the mean over the grids having it
        means = {p: {cell: statistics.fmean(g[cell] for g in grids if cell in g) for cell in set().union(*grids)}
                 for p, grids in paradigms.items()}  # fmt: skip
        for paradigm in sorted(set(paradigms) - {base}):
            shared = means[paradigm].keys() & means[base].keys()
            counts = f"{len(paradigms[paradigm])} vs {len(paradigms[base])} runs"
            name = f"{paradigm} − {base} ({model}, {data}, {encoding}; {counts})"
            found[name] = {cell: means[paradigm][cell] - means[base][cell] for cell in shared}
    return found


TITLE = (
    "Needle depth (niah tasks: % of references found by where the needle sat, per checkpoint then the mean over "
    "the run's checkpoints; in brackets, references per checkpoint)"
)


def depth_sections(runs: dict[str, DepthRun]) -> list[str]:
    """The markdown under TITLE: a table per series, then per paradigm difference."""
    lines = []
    for name, run in sorted(runs.items()):
        lines += [f"### {name}", "", depth_table(run.grid(), run.references()), ""]
    for name, grid in differences(runs).items():
        lines += [f"### {name} (percentage points)", "", depth_table(grid), ""]
    return lines


def depth_table(grid: dict[Cell, float], counts: dict[Cell, int] | None = None) -> str:
    """Depth buckets down, lengths across; `counts`: references per checkpoint, shown in brackets;
    without them the values are differences, shown signed."""
    lengths = sorted({length for _, length in grid})

    def shown(cell: Cell) -> str:
        if cell not in grid:
            return "–"
        return f"{grid[cell]:+.1f}" if counts is None else f"{grid[cell]:.1f} ({counts[cell]})"

    rows = [[bucket_label(bucket), *(shown((bucket, n)) for n in lengths)] for bucket in range(BUCKETS)]
    return markdown_table(["needle depth", *map(length_label, lengths)], rows)


def bucket_label(bucket: int) -> str:
    return f"{100 * bucket // BUCKETS}-{100 * (bucket + 1) // BUCKETS}%"
