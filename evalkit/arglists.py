"""Comma-separated lists as users write them (--lengths, --tasks, --paradigms, --dtypes, ...).

Every command reads its lists through `parse_list`, so they all behave alike: blanks are
dropped and each value is kept once, in the order first given, compared after parsing (4k and
4096 are one length). A list built by a shell loop that repeats a value must not score or store
a cell twice (a summary holding one cell twice is refused by the leaderboard).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

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
