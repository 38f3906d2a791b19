"""A unit of a benchmark and where a benchmark's files live under --out: below the pipeline, so its
executors (the shards, the Ray workers: evalkit.sweep) and the benchmarks name the files alike."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalkit.errors import UserError
from evalkit.files import check_output_dir, read_json_object, refuse_foreign
from evalkit.models.refs import CheckpointRef
from evalkit.store.result_format import failed_name, not_understood, summary_name
from evalkit.store.sample_log import HERE, Writer, checkpoint_dir


@dataclass(frozen=True)
class Unit:
    """One thing a benchmark scores on a checkpoint: a task, at a length where lengths apply."""

    task: str
    length: int | None = None

    def label(self) -> str:
        return self.task if self.length is None else f"{self.task} @ {self.length}"

    def fields(self) -> dict[str, Any]:
        return {"task": self.task, **({"length": self.length} if self.length is not None else {})}


@dataclass(frozen=True)
class UnitStore:
    """Where one unit of one checkpoint keeps its files: no benchmark builds a path under --out, so the
    pipeline's loop, a shard and a Ray worker find a unit's files alike. Writes go only through
    `writer`: a Ray worker's hands each to the driver, the one writer."""

    out: Path
    ref: CheckpointRef
    benchmark: str
    unit: Unit
    writer: Writer = HERE

    @property
    def folder(self) -> Path:
        return checkpoint_dir(self.out, self.ref) / self.benchmark

    def file(self, suffix: str = ".json") -> Path:
        """The unit's own file: <folder>/<task>/<length><suffix> for a task at a length, else
        <folder>/<task><suffix> (a task name as a file name: a stray '/' must not make a folder)."""
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", self.unit.task)
        if self.unit.length is None:
            return self.folder / f"{stem}{suffix}"
        return self.folder / stem / f"{self.unit.length}{suffix}"


@dataclass(frozen=True)
class CheckpointFiles:
    """Where one checkpoint's results of one benchmark live: its summary, failure record and units' files."""

    out: Path
    ref: CheckpointRef
    benchmark: str

    @property
    def summary(self) -> Path:
        return checkpoint_dir(self.out, self.ref) / summary_name(self.benchmark)

    @property
    def failed(self) -> Path:
        return checkpoint_dir(self.out, self.ref) / failed_name(self.benchmark)

    def unit(self, unit: Unit, writer: Writer = HERE) -> UnitStore:
        return UnitStore(self.out, self.ref, self.benchmark, unit, writer)


def averages_paths(out: Path, benchmark: str) -> tuple[Path, Path]:
    """--avg's files: <out>/<benchmark>-avg.json (the records) and .md (the table)."""
    return out / f"{benchmark}-avg.json", out / f"{benchmark}-avg.md"


def check_results_dir(out: Path, benchmark: str, refs: Iterable[CheckpointRef]) -> None:
    """Before any work: `out` is writable, and every file this request may replace is evalkit's own
    (never a file of the user's) and of this format (a summary of another would lose its cells)."""
    averages, checkpoints = averages_paths(out, benchmark), [CheckpointFiles(out, ref, benchmark) for ref in refs]
    check_output_dir(out)
    refuse_foreign(averages, heading="# .+, averaged over checkpoints")  # as sweep.pipeline.write_averages heads it
    for files in checkpoints:
        refuse_foreign([files.summary, files.failed])  # what is left there is an evalkit JSON object, or nothing
        reason = files.summary.exists() and not_understood(files.summary, read_json_object(files.summary))
        if reason:
            raise UserError(
                f"{files.summary} is of another format ({reason}); it is not replaced: choose another --out"
            )
