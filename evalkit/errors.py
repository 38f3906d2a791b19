"""Errors a user can fix: the CLI prints them as one line, without a traceback, and exits 2."""


class UserError(Exception):
    """Bad input: the message says what was wrong and how to fix it."""
