"""Haystacks as streams of units (lines or words), and prompts as streams with pieces inserted.

A stream knows each unit's text and the tokens it adds after the unit before ("native" counts)
as prefix sums, so a haystack of any size is a subtraction. A needle inserted between two units
changes only the counts at its junctions, which `stream_items` accounts for. Every unit starts
with the stream's `sep`; split(j) is unit j as (its opening, tokens of the rest): only the
opening is counted after what precedes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from evalkit.ruler.counting import LEFT_CONTEXT_CHARS, Block, Item, TokenCounter


class RepeatedLine:
    """The same line over and over (RULER's noise haystack)."""

    def __init__(self, counter: TokenCounter, line: str, sep: str = "\n"):
        self.sep = sep
        self.unit = sep + line
        self.per_unit = counter.after(self.unit, self.unit)
        first_word = line.split(" ", 1)[0]
        self.opening = sep + first_word
        self.rest_tokens = counter.after(self.opening, line[len(first_word) :])

    def piece(self, j: int) -> str:
        return self.unit

    def split(self, j: int) -> tuple[str, int]:
        return self.opening, self.rest_tokens

    def native_sum(self, a: int, b: int) -> int:
        return (b - a) * self.per_unit

    def text(self, a: int, b: int) -> str:
        return self.unit * (b - a)


class GrowingStream:
    """Units appended block by block on demand, with prefix sums of their native counts."""

    block_size = 256

    def __init__(self, counter: TokenCounter, sep: str):
        self.counter = counter
        self.sep = sep
        self._pieces: list[str] = []
        self._prefix = np.zeros(1, dtype=np.int64)

    def _next_block(self, start: int, size: int) -> list[str]:
        raise NotImplementedError  # each stream draws or reads its own units

    def _count_block(self, pieces: list[str], left: str) -> list[int]:
        lefts = [left] + pieces[:-1]
        return self.counter.after_many(zip(lefts, pieces))

    def ensure(self, n: int) -> None:
        while len(self._pieces) < n:
            start = len(self._pieces)
            pieces = self._next_block(start, max(self.block_size, n - start))
            left = self._pieces[-1] if self._pieces else ""
            counts = np.asarray(self._count_block(pieces, left), dtype=np.int64)
            self._pieces.extend(pieces)
            self._prefix = np.concatenate([self._prefix, self._prefix[-1] + np.cumsum(counts)])

    def piece(self, j: int) -> str:
        self.ensure(j + 1)
        return self._pieces[j]

    def split(self, j: int) -> tuple[str, int]:
        return self.piece(j), 0  # streams whose units are long override this

    def native_sum(self, a: int, b: int) -> int:
        self.ensure(b)
        return int(self._prefix[b] - self._prefix[a])

    def average(self, n: int) -> float:
        """Mean tokens per unit over the first n units (a sizing guess)."""
        self.ensure(n)
        return float(self._prefix[n] - self._prefix[1]) / max(1, n - 1)

    def text(self, a: int, b: int) -> str:
        self.ensure(b)
        return "".join(self._pieces[a:b])


Stream = RepeatedLine | GrowingStream


class NumberedLabels:
    """upto(n): tokens of the labels first..n (qa's " k:", cwe's " i."), each after `left`; grown on demand."""

    def __init__(self, counter: TokenCounter, left: str, label: str, first: int):
        self.counter, self.left, self.label = counter, left, label
        self.prefix = np.zeros(first, dtype=np.int64)

    def upto(self, n: int) -> int:
        while len(self.prefix) <= n:
            numbers = range(len(self.prefix), max(2 * len(self.prefix), n + 1))
            counts = self.counter.after_many((self.left, self.label.format(k)) for k in numbers)
            self.prefix = np.concatenate([self.prefix, self.prefix[-1] + np.cumsum(counts)])
        return int(self.prefix[n])


def stream_items(stream: Stream, size: int, insertions: Sequence[tuple[int, str]], strip_first: bool) -> list[Item]:
    """Units [0, size) with each (position, body) inserted, with the stream's separator, before
    unit `position`; `strip_first`: the first piece loses its separator (the template has it)."""
    items: list[Item] = []
    sep = stream.sep
    done = 0
    for position, body in sorted(insertions, key=lambda pair: pair[0]):
        if position > done:
            items.append(_span(stream, done, position, strip_first and not items))
            done = position
        items.append(body if strip_first and not items else sep + body)
    if done < size:
        items.append(_span(stream, done, size, strip_first and not items))
    return items


def _span(stream: Stream, a: int, b: int, strip: bool) -> Block:
    first = stream.piece(a)
    opening, rest = stream.split(a)
    if strip:
        first, opening = first[len(stream.sep) :], opening[len(stream.sep) :]
    tail, j = "", b - 1
    while len(tail) < LEFT_CONTEXT_CHARS and j >= a:
        tail = (first if j == a else stream.piece(j)) + tail
        j -= 1
    render: Callable[[], str] = lambda: first + stream.text(a + 1, b)  # noqa: E731
    return Block(opening, rest + stream.native_sum(a + 1, b), tail[-LEFT_CONTEXT_CHARS:], render)
