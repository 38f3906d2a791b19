"""Loads evalkit's offline fixture data for lm-eval (the YAMLs here name it as `custom_dataset`).

The JSONL files sit beside this module and are found relative to it, so the fixture tasks run
from any working directory, with no download, no network and no write to the datasets cache.
Each line carries its split in a `split` field; the mmlu-style lines also carry a `subject`, the
BABILong-style ones the `length` (the dataset config, 0k, 1k) they stand for.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_jsonl(data_file: str, subject: str | None = None, length: str | None = None, **_task_metadata):
    """A DatasetDict with one split per distinct `split` value of `data_file` (relative to this folder),
    of the rows of `subject` and `length` where given.

    lm-eval also passes the task's metadata (version, ...) as keywords; they do not choose data.
    """
    import datasets

    path = HERE / data_file
    if not path.is_file():
        raise FileNotFoundError(f"fixture data file {path} does not exist")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [row for row in rows if subject in (None, row.get("subject")) and length in (None, row.get("length"))]
    if not rows:
        raise ValueError(f"{path.name} has no documents of {subject or f'length {length}'}")
    splits: dict[str, list[dict]] = {}
    for row in rows:
        splits.setdefault(row["split"], []).append(row)
    return datasets.DatasetDict({name: datasets.Dataset.from_list(items) for name, items in splits.items()})


def load_babilong(data_file: str, qa_split: str, max_seq_lengths: str = "0k", **_task_metadata):
    """BABILong's loader (lm-eval's babilong/common_utils.py load_dataset) on fixture data: the documents
    of the length lm-eval's metadata `max_seq_lengths` names (its default 0k), as split `qa_split`."""
    return load_jsonl(data_file, length=max_seq_lengths)
