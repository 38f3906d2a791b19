"""Loads evalkit's offline fixture data for lm-eval (the YAMLs here name it as `custom_dataset`).

The JSONL files sit beside this module and are found relative to it, so the fixture tasks run
from any working directory, with no download, no network and no write to the datasets cache.
Each line carries its split in a `split` field; the mmlu-style lines also carry a `subject`.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_jsonl(data_file: str, subject: str | None = None, **_task_metadata):
    """A DatasetDict with one split per distinct `split` value of `data_file` (relative to this folder).

    lm-eval also passes the task's metadata (version, ...) as keywords; they do not choose data.
    """
    import datasets

    path = HERE / data_file
    if not path.is_file():
        raise FileNotFoundError(f"fixture data file {path} does not exist")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if subject is not None:
        rows = [row for row in rows if row.get("subject") == subject]
    splits: dict[str, list[dict]] = {}
    for row in rows:
        splits.setdefault(row["split"], []).append(row)
    return datasets.DatasetDict({name: datasets.Dataset.from_list(items) for name, items in splits.items()})
