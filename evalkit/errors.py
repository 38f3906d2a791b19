"""Errors a user can fix, and the one way any benchmark says a task cannot run.

The CLI prints a UserError as one line, without a traceback, and exits 2. Skipped is what a
benchmark raises for one unit (a RULER task at a length, an lm-eval task) that cannot be
scored; the pipeline records it with its reason and goes on with the other units.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: the message says what was wrong and how to fix it."""


class Skipped(UserError):
    """A unit of a benchmark that cannot be scored as asked: `reason` is one line for the user
    and the skip record; `details` are the further fields the record keeps (counts, lengths)."""

    def __init__(self, reason: str, message: str | None = None, **details: object):
        super().__init__(message or reason)
        self.reason = reason
        self.details = details
