"""The GPU checks' results written the moment each exists: one JSON line per result, flushed.

A lent GPU machine returns what a command left under $OUT even when the command is killed at its
time limit or runs out of memory: a check that writes its report only at the end leaves nothing.
Each line is complete when written (a kill can tear at most the last one, which readers skip).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any


def _plain(value: Any) -> Any:
    """JSON-safe: nan and inf as strings (json.dumps would write invalid JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class ResultLog:
    """Appends records to a JSONL file (and echoes them to stdout); path None: stdout only."""

    def __init__(self, path: Path | str | None, *, echo: bool = True):
        self.path = Path(path) if path else None
        self.echo = echo
        self.started = time.monotonic()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, kind: str, /, **fields: Any) -> dict:
        record = _plain({"kind": kind, "elapsed_s": round(time.monotonic() - self.started, 2), **fields})
        line = json.dumps(record, sort_keys=False)
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(line + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        if self.echo:
            print(line, file=sys.stdout, flush=True)
        return record


def read_results(path: Path | str) -> list[dict]:
    """The records of a result log, a torn last line (a kill while writing) skipped."""
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number != len(lines) - 1:
                raise
    return records
