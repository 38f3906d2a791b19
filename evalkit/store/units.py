"""A unit of a benchmark and where its files live: below the pipeline, so its executors (the
shards, the Ray workers: evalkit.sweep) and the benchmarks name a unit's files alike."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalkit.models.refs import CheckpointRef
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
    """Where one unit of one checkpoint keeps its files. The pipeline says where, the benchmark
    what: every unit of a benchmark on a checkpoint lives in <out>/<run>/step-<N>/<benchmark>/
    (`folder`, beside the checkpoint's summary), in files named from the unit (`file`). No
    benchmark builds a path under --out, so the pipeline's loop, a shard and a Ray worker find a unit's
    files alike; what makes a stored result valid (its settings' identity, evalkit.store.identity) is
    written in those files and checked by the benchmark that reads them. A benchmark writes them
    only through `writer`: on a Ray worker, it hands every write to the driver, the one writer."""

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
