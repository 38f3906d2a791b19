"""Where results live and how they survive a kill.

    <out>/<run>/step-<N>/ruler/<task>/<length>.jsonl   one line per finished sample (appended, fsynced)
    <out>/<run>/step-<N>/ruler-summary.json            long-form rows + provenance (atomic)

A per-sample log is the unit of resumption: a rerun reads it, keeps the lines made from the
same data (same data key) and computes only the samples that are missing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from evalkit.results.checkpoints import CheckpointRef


def checkpoint_dir(out_dir: Path, ref: CheckpointRef) -> Path:
    return Path(out_dir) / ref.run / f"step-{ref.step}"


class SampleLog:
    """Append-only JSONL of finished samples, keyed by sample index, for one (task, length)."""

    def __init__(self, path: Path, data_key: str):
        self.path, self.data_key = Path(path), data_key
        self.records: dict[int, dict[str, Any]] = {}
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        kept, dropped = [], False
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # the half-written last line of a killed run
                dropped = True
                continue
            if record.get("data_key") != self.data_key:  # made from other data: recompute
                dropped = True
                continue
            if int(record["index"]) in self.records:
                # Two writers once appended the same sample (before output_lock existed): the
                # first line stands, so the log again holds each sample once.
                dropped = True
                continue
            self.records[int(record["index"])] = record
            kept.append(line)
        if dropped:  # rewrite without the lines we will not use, so appends stay clean
            from evalkit.results_io import atomic_write_text

            atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def done(self) -> set[int]:
        return set(self.records)

    def append(self, records: list[dict[str, Any]]) -> None:
        """Add finished samples durably: a kill after this returns loses none of them."""
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            for record in records:
                record = {**record, "data_key": self.data_key}
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                self.records[int(record["index"])] = record
            handle.flush()
            os.fsync(handle.fileno())

    def ordered(self) -> list[dict[str, Any]]:
        return [self.records[i] for i in sorted(self.records)]
