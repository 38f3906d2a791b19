"""Why a (task, length) produced no data: the runner records it as skipped with this reason."""

from __future__ import annotations

from evalkit.errors import Skipped


class TaskSkipped(Skipped):
    """A task cannot be generated for this length; `reason` is one line for the results table."""

    def __init__(self, task: str, length: int, reason: str):
        self.task, self.length = task, length
        super().__init__(reason, f"{task} at length {length}: {reason}")


class TaskDataMissing(TaskSkipped):
    """The task needs data that is not here (QA files, an essay file, a word list)."""


class TaskDoesNotFit(TaskSkipped):
    """Even the smallest valid sample is longer than the target length with this tokenizer."""

    def __init__(self, task: str, length: int, min_length: int, detail: str = ""):
        self.min_length = min_length
        why = f" ({detail})" if detail else ""
        super().__init__(
            task, length, f"does not fit{why}: needs a length of at least {min_length} tokens with this tokenizer"
        )
        self.details = {"min_length": min_length}  # kept in the skip record: the length that would fit
