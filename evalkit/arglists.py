"""Comma-separated lists as users write them (parse_list: every list option reads through it, blanks
and repeats dropped: docs/reliability.md's "A value given twice is used once"), and whole numbers
read from the environment (environ_int).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, overload

from evalkit.errors import UserError

T = TypeVar("T")


# Items of an iterable that are not strings are taken as already parsed: they pass through as they are.
@overload
def parse_list(value: str | Iterable[T]) -> list[str | T]: ...
@overload
def parse_list(value: str | Iterable[str | T], parse: Callable[[str], T]) -> list[T]: ...


def parse_list(value: str | Iterable, parse: Callable[[str], Any] = str.strip) -> list[Any]:
    """`value` split at commas (or an iterable of items), each item parsed, duplicates dropped."""
    items = value.split(",") if isinstance(value, str) else list(value)
    given = [item for item in items if not isinstance(item, str) or item.strip()]  # blanks dropped
    return list(dict.fromkeys(parse(item.strip()) if isinstance(item, str) else item for item in given))


def environ_int(name: str, default: int | None = None, environ: Mapping[str, str] = os.environ, fix: str = "") -> int:
    """The whole number in the environment variable `name` (`default` when unset), in ASCII digits
    only: int() takes '３' and '٣' as 3 and str.isdigit() takes '²', which int() refuses with a
    ValueError. Anything else is one line naming the variable; `fix` says what to do instead."""
    value = environ.get(name)
    if value is None and default is not None:
        return default
    if value is None or not re.fullmatch(r"\s*[0-9]+\s*", value):
        found = "is not set" if value is None else f"is {value!r}, not a whole number in digits 0-9"
        raise UserError(f"${name} {found}" + (f"; {fix}" if fix else ""))
    return int(value)
