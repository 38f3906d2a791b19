"""Per-sample logs, the unit of resumption: a rerun keeps the lines made under the same key
(RULER's evalkit.ruler.runner.answer_key, ppl's PplBenchmark._key) and computes the rest. Each
record carries `sha` (record_checksum): an edited record is refused with file and line
(docs/reliability.md), never scored nor recomputed behind the user's back.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
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
    """How a unit's files are written: here, durably, by the one process that writes under --out (a
    local run; a Ray sweep's driver, to which a worker's Handover writer hands each write)."""

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


def sample_index(record: dict[str, Any]) -> int | None:
    """RULER's sample id: its index (None: not a sample record)."""
    index = record.get("index")
    return index if isinstance(index, int) else None


@dataclass
class SampleLog:
    """Append-only JSONL of finished samples for one unit, each record sealed with its key and
    checksum, read back by its sample's id (`identify`: None for a record that is not a sample's).
    A log of its own (RULER's: one per cell) is rewritten without the lines it will not use. A
    `shared` log (ppl's: every setting of a length) is never rewritten: other keys' lines stay for
    their reruns, a torn line anywhere is passed over, a record from before checksums recomputed."""

    path: Path
    key: str
    writer: Writer = HERE  # where the log's changes go (a Ray worker's: to its driver)
    _: KW_ONLY
    identify: Callable[[dict[str, Any]], Any] = sample_index
    shared: bool = False
    records: dict[Any, dict[str, Any]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        kept, dropped = [], False
        text = self.path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if not self.shared and number < len(lines) and line.strip():  # only a killed run's last line is torn
                    raise UserError(
                        f"{self.path}:{number} is not a sample record (not written by evalkit?); move the file "
                        "away, or delete that line, and rerun"
                    ) from None
                dropped = True
                continue
            if self.shared and not (isinstance(record, dict) and record.get(KEY) == self.key and CHECKSUM in record):
                continue  # another key's record, or one from before checksums: computed again, never trusted
            sample = self._verify(record, number)
            # Made from other data or settings: recompute. A sample twice: two writers once appended it
            # (before output_lock existed), and the first line stands, so the log holds each sample once.
            if record.get(KEY) != self.key or sample in self.records:
                dropped = True
                continue
            self.records[sample] = record
            kept.append(line)
        if dropped and not self.shared:  # rewrite without the lines we will not use, so appends stay clean
            self.writer.text(self.path, "".join(line + "\n" for line in kept))
        elif text and not text.endswith("\n"):  # a shared log's torn last line: later appends start a new one
            self.writer.append(self.path, "\n")

    def _verify(self, record: Any, number: int) -> Any:
        """The record's sample id; refuse a record that is not what evalkit wrote: not a sample
        record, or not matching its checksum."""
        sample = self.identify(record) if isinstance(record, dict) else None
        if sample is None:
            problem = "is not a sample record (edited by hand?)"
        elif CHECKSUM not in record:
            problem = "has no checksum (edited by hand?)"
        elif record[CHECKSUM] != record_checksum(record):
            problem = "does not match its checksum (edited or damaged)"
        else:
            return sample
        raise UserError(f"{self.path}:{number} {problem}; delete that line, or the file, and rerun to recompute it")

    def append(self, records: list[dict[str, Any]]) -> None:
        """Add finished samples durably: a kill after this returns loses none of them."""
        if not records:
            return
        keyed = [{**record, KEY: self.key} for record in records]
        sealed = [{**record, CHECKSUM: record_checksum(record)} for record in keyed]
        self.writer.append(self.path, "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in sealed))
        self.records.update((self.identify(record), record) for record in sealed)


def record_checksum(record: dict[str, Any]) -> str:
    """sha256 of the record's canonical JSON without its checksum field: key order and spacing
    do not change it, any changed value does."""
    content = {key: value for key, value in record.items() if key != CHECKSUM}
    text = json.dumps(content, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
