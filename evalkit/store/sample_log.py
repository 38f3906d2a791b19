"""Where results live and how they survive a kill.

    <out>/<run>/step-<N>/ruler/<task>/<length>.jsonl   one line per finished sample (appended, fsynced)
    <out>/<run>/step-<N>/ruler-summary.json            long-form rows + provenance (atomic)

A per-sample log is the unit of resumption: a rerun reads it, keeps the lines made under the
same key (`key`: RULER's answer key, evalkit.ruler.runner.answer_key: the sample's prompt, the
engine's result facts and every setting that changes an answer, not the sample count) and
computes only the samples that are missing.

Each record carries `sha`, the sha256 of its own canonical JSON without that field: a record
edited by hand (an answer or a score changed) no longer matches it, and loading the log refuses
it with the file and line instead of scoring it. These are results, so nothing is recomputed or
trusted behind the user's back: they delete the line (or the file) and rerun to recompute it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from evalkit.errors import UserError
from evalkit.files import atomic_write_text, naming
from evalkit.models.refs import CheckpointRef, step_dir_name

CHECKSUM = "sha"  # the record field holding the checksum of the rest of the record
KEY = "key"  # the record field holding the key it was made under


def checkpoint_dir(out_dir: Path, ref: CheckpointRef) -> Path:
    return Path(out_dir) / ref.run / step_dir_name(ref.step)


class Writer:
    """How a unit's files are written: here, durably, by the one process that writes under --out
    (a local run; the driver of a Ray sweep). A Ray worker's writer hands each write to its driver
    instead (evalkit.sweep.ray_executor.Handover), which writes it with this one."""

    def text(self, path: Path, text: str) -> None:
        """Replace the file, atomically."""
        atomic_write_text(path, text)

    def append(self, path: Path, text: str) -> None:
        """Add to the file, durably: a kill after this returns loses none of it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with naming(path), path.open("a", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())


HERE = Writer()


class SampleLog:
    """Append-only JSONL of finished samples, keyed by sample index, for one (task, length)."""

    def __init__(self, path: Path, key: str, writer: Writer = HERE):
        """`writer`: where the log's changes go (a Ray worker's: to its driver)."""
        self.path, self.key, self.writer = Path(path), key, writer
        self.records: dict[int, dict[str, Any]] = {}
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        kept, dropped = [], False
        lines = self.path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number < len(lines) and line.strip():  # only a killed run's last line is torn
                    raise UserError(
                        f"{self.path}:{number} is not a sample record (not written by evalkit?); move the file "
                        "away, or delete that line, and rerun"
                    ) from None
                dropped = True
                continue
            self._verify(record, number)
            if record.get(KEY) != self.key:  # made from other data or settings: recompute
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
            self.writer.text(self.path, "".join(line + "\n" for line in kept))

    def _verify(self, record: Any, number: int) -> None:
        """Refuse a record that is not what evalkit wrote: not a sample record, or not matching its checksum."""
        where = f"{self.path}:{number}"
        if not isinstance(record, dict) or not isinstance(record.get("index"), int):
            raise UserError(
                f"{where} is not a sample record (edited by hand?); delete that line, "
                "or the file, and rerun to recompute it"
            )
        if CHECKSUM not in record:
            raise UserError(
                f"{where} has no checksum (edited by hand?); delete that line, or the file, and rerun to recompute it"
            )
        if record[CHECKSUM] != record_checksum(record):
            raise UserError(
                f"{where} does not match its checksum (edited or damaged); delete that line, "
                "or the file, and rerun to recompute it"
            )

    def done(self) -> set[int]:
        return set(self.records)

    def append(self, records: list[dict[str, Any]]) -> None:
        """Add finished samples durably: a kill after this returns loses none of them."""
        if not records:
            return
        sealed = []
        for record in records:
            record = {**record, KEY: self.key}
            record[CHECKSUM] = record_checksum(record)
            sealed.append(record)
        self.writer.append(self.path, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in sealed))
        self.records.update((int(record["index"]), record) for record in sealed)

    def ordered(self) -> list[dict[str, Any]]:
        return [self.records[i] for i in sorted(self.records)]


def record_checksum(record: dict[str, Any]) -> str:
    """sha256 of the record's canonical JSON without its checksum field: key order and spacing
    do not change it, any changed value does."""
    content = {key: value for key, value in record.items() if key != CHECKSUM}
    text = json.dumps(content, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
