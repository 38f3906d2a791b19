"""Why a task is skipped: raised while loading or running it, recorded with its one-line reason."""

from __future__ import annotations

from evalkit.errors import Skipped


class TaskCannotRun(Skipped):
    """A task evalkit cannot run as asked; `reason` is one line for the user and the skip record."""


class DatasetUnavailable(TaskCannotRun):
    """A task whose data could not be loaded (not cached and no network, no such file)."""


class RequestsExceedWindow(TaskCannotRun):
    """Some requests need more tokens than the model window; nothing of the task was computed.
    `documents` and `over`: per lm-eval task, the documents of every request checked and of those
    that did not fit, so a rerun can score the documents that fit (--too-long documents)."""

    def __init__(
        self,
        request_type: str,
        too_long: int,
        total: int,
        longest: int,
        window: int,
        documents: dict[str, set[int]],
        over: dict[str, set[int]],
    ):
        self.window, self.documents, self.over = window, documents, over
        super().__init__(
            f"{too_long} of {total} {request_type} requests need more than the model window of {window} tokens "
            f"(longest {longest}); evalkit never truncates: use fewer shots (--num-fewshot), a model with a "
            "longer window, or the engine's max_length setting"
        )
        # Kept in the skip record, so that reports can count the requests that did not fit.
        self.details = {"requests_over_window": too_long, "requests": total, "longest": longest, "window": window}
