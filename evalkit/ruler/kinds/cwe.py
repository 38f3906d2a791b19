"""Common words extraction (cwe): a numbered word list; 10 words appear far more often.

From common_words_extraction.py: at lengths >= 4096 the list has 10 common words x30 and the
other words x3, after one answered demonstration of 40 words (10 x10, 30 x3); below 4096 the
demonstration has 20 words (10 x3, 10 x1) and the list 10 x6 and the rest x1. The number of
distinct words is the size fitted to the length. Words come from wonderwords' lists.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from evalkit.ruler.context import Context
from evalkit.ruler.counting import LEFT_CONTEXT_CHARS, SPACED_LEFT, Block, Item, TokenCounter, compose_count
from evalkit.ruler.errors import TaskDataMissing
from evalkit.ruler.kinds import KindPlan, KindTask
from evalkit.ruler.layout import NumberedLabels
from evalkit.ruler.spec import CWE_PREFIX, CWE_TEMPLATE
from evalkit.ruler.words import common_words_pool, extra_prose_words

NUM_COMMON = 10
DATA_CONSTANTS = {"NUM_COMMON": NUM_COMMON}  # keyed into the cache (evalkit.ruler.kinds)


class WordTable:
    """Words with the tokens of " word" (after any text)."""

    def __init__(self, words: np.ndarray, tokens: np.ndarray):
        self.words, self.tokens = words, tokens

    @classmethod
    def counted(cls, counter: TokenCounter, words: tuple[str, ...]) -> WordTable:
        tokens = np.asarray(counter.spaced([" " + word for word in words]), dtype=np.int64)
        return cls(np.asarray(words, dtype=object), tokens)

    def __add__(self, other: WordTable) -> WordTable:
        return WordTable(np.concatenate([self.words, other.words]), np.concatenate([self.tokens, other.tokens]))


_LABELS: list[str] = []


def numbered(words: list[str]) -> str:
    """ "1. w1 2. w2 ..." (labels built once: this runs over thousands of entries per sample)."""
    while len(_LABELS) < len(words):
        _LABELS.extend(f"{i}. " for i in range(len(_LABELS) + 1, 2 * len(_LABELS) + 1024))
    return " ".join(map(str.__add__, _LABELS[: len(words)], words))


def repeated(words: np.ndarray, common_repeats: int, other_repeats: int) -> np.ndarray:
    """A list's entries: the first NUM_COMMON words (the common ones) and the rest, each repeated."""
    return np.concatenate([np.repeat(words[:NUM_COMMON], common_repeats), np.repeat(words[NUM_COMMON:], other_repeats)])


def list_block(
    sep: str, words: Callable[[], list[str]], last_two: list[str], word_tokens: int, numbers: NumberedLabels, count: int
) -> Block:
    """`sep + "1. w1 2. w2 ..."` of `count` entries: its start counted in context, the rest from
    tables; sized from its last two words, the full list built only when it is written out."""
    last = f" {count - 1}. {last_two[0]} {count}. {last_two[1]}" if count > 1 else f"1. {last_two[-1]}"
    tail = last[-LEFT_CONTEXT_CHARS:]
    return Block(sep + "1.", word_tokens + numbers.upto(count), tail, lambda: sep + numbered(words()))


class CommonWordsPlan(KindPlan["CommonWordsTask"]):
    min_size = NUM_COMMON + 1

    def __init__(self, task: CommonWordsTask, index: int):
        super().__init__(task, index)
        ctx = task.ctx
        rng = np.random.default_rng(ctx.seed_for(index, "sample"))
        words: WordTable = task.tables["words"]
        self.demo = self._demo(task, rng, words)
        # Distinct words in a random order: the first 10 are the common ones, then the rest.
        self.order = rng.permutation(len(words.words))
        self.table = words
        self.max_size = len(words.words)
        if ctx.length >= 65536:  # only long lists can outgrow wonderwords' words
            self._add_extra_words(ctx.seed_for(index, "extra words"))
        self.cumulative = np.concatenate([[0], np.cumsum(self.table.tokens[self.order])])
        self.outputs = [str(word) for word in self.table.words[self.order[:NUM_COMMON]]]
        self.prefix = CWE_PREFIX
        self.last_tail = ctx.tail(task.tail, self.prefix)

    def _add_extra_words(self, seed: int) -> None:
        """Beyond wonderwords' words: its words all first (in random order), then prose words."""
        tables = self.task.tables
        if "extra" not in tables:  # counted once per tokenizer, when a list first needs them
            tables["extra"] = WordTable.counted(self.ctx.counter, extra_prose_words())
        extra = tables["extra"]
        tail = len(self.table.words) + np.random.default_rng(seed).permutation(len(extra.words))
        self.order = np.concatenate([self.order, tail])
        self.table = self.table + extra
        self.max_size = len(self.table.words)

    @staticmethod
    def _demo(task: CommonWordsTask, rng: np.random.Generator, words: WordTable) -> list[Item]:
        """The answered demonstration: its list and answer, then the task's own template."""
        count, common_repeats, other_repeats = task.demo_shape
        picked = rng.choice(len(words.words), size=count, replace=False)
        entries = repeated(picked, common_repeats, other_repeats)
        entries = entries[rng.permutation(len(entries))]
        numbers = task.tables["numbers"]
        listed = words.words[entries].tolist()
        listing = list_block("\n", lambda: listed, listed[-2:], int(words.tokens[entries].sum()), numbers, len(listed))
        answer_words = words.words[picked[:NUM_COMMON]].tolist()
        answer_tokens = int(words.tokens[picked[:NUM_COMMON]].sum())
        answer = list_block(" ", lambda: answer_words, answer_words[-2:], answer_tokens, numbers, NUM_COMMON)
        return [task.ctx.head(task.head), listing, task.tail + CWE_PREFIX, answer, "\n" + task.head]

    def _entries(self, size: int, shuffled: bool) -> tuple[np.ndarray, int]:
        """Word indices of the list (common x many, others x few) and their tokens."""
        common_repeats, other_repeats = self.task.repeats
        chosen = self.order[:size]
        tokens = common_repeats * int(self.cumulative[NUM_COMMON]) + other_repeats * int(
            self.cumulative[size] - self.cumulative[NUM_COMMON]
        )
        entries = repeated(chosen, common_repeats, other_repeats)
        if shuffled:
            entries = entries[np.random.default_rng(self.position_seed ^ size).permutation(len(entries))]
        return entries, tokens

    def _items(self, size: int, shuffled: bool) -> list[Item]:
        entries, tokens = self._entries(size, shuffled)
        table = self.table
        last_two = table.words[entries[-2:]].tolist()
        render = lambda: table.words[entries].tolist()  # noqa: E731
        listing = list_block("\n", render, last_two, tokens, self.task.tables["numbers"], len(entries))
        return [*self.demo, listing, self.last_tail]

    def items(self, size: int) -> list[Item]:
        return self._items(size, shuffled=True)

    def estimate(self, size: int) -> int:
        return compose_count(self.ctx.counter, self._items(size, shuffled=False), rough=True)

    def per_unit(self) -> float:
        return self.task.repeats[1] * (float(self.table.tokens.mean()) + 3.0)

    def check_fit(self, size: int, tokens: int) -> None:
        """Every word in use and still far below the target: say so rather than land short silently."""
        if size == self.max_size and self.ctx.budget - tokens > max(64, self.ctx.budget // 100):
            raise TaskDataMissing(
                self.ctx.spec.name, self.ctx.length, f"needs more than the {self.max_size} distinct words available"
            )


class CommonWordsTask(KindTask):
    Plan = CommonWordsPlan

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        params = ctx.spec.params
        if ctx.length < 4096:
            self.demo_shape, self.repeats = (20, 3, 1), (6, 1)
        else:
            self.demo_shape, self.repeats = (40, 10, 3), (params["freq_cw"], params["freq_ucw"])
        head, self.tail = CWE_TEMPLATE.split("{context}")
        self.head = head[:-1]  # the list's first entry carries the newline
        counter = ctx.counter
        if "cwe" not in counter.tables:  # counted once per tokenizer
            counter.tables["cwe"] = {
                "words": WordTable.counted(counter, common_words_pool()),
                "numbers": NumberedLabels(counter, SPACED_LEFT, " {}.", 2),  # " 2." ...: "1." opens the list
            }
        self.tables = counter.tables["cwe"]
