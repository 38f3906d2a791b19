"""Frequent words extraction (fwe): coded words drawn from a zeta distribution; name the top three.

From freq_words_extraction.py: a vocabulary of (length - 50) // 50 random 6-letter words, the
k-th of which appears int(N * k^-alpha / zeta(alpha)) times; the most frequent is replaced by
'...' (noise to ignore) and the answer is the next three. N, the number of words drawn, is the
size fitted to the length.
"""

from __future__ import annotations

import math

import numpy as np

from evalkit.ruler.context import Context
from evalkit.ruler.counting import LEFT_CONTEXT_CHARS, Block, Item, compose_count
from evalkit.ruler.errors import TaskDoesNotFit
from evalkit.ruler.fitting import Coarse
from evalkit.ruler.kinds import KindPlan, KindTask
from evalkit.ruler.spec import FWE_PREFIX, FWE_TEMPLATE

NOISE_WORD = "..."
ANSWER_RANKS = (2, 3, 4)  # ranks of the answer words (rank 1 is the noise word)
DATA_CONSTANTS = {"NOISE_WORD": NOISE_WORD, "ANSWER_RANKS": ANSWER_RANKS}  # keyed into the cache (evalkit.ruler.kinds)


def zeta(alpha: float) -> float:
    """Riemann zeta for alpha > 1 (Euler-Maclaurin; scipy.special.zeta in NVIDIA's script)."""
    n = 64
    head = sum(k**-alpha for k in range(1, n))
    tail = n ** (1 - alpha) / (alpha - 1) + 0.5 * n**-alpha + alpha * n ** (-alpha - 1) / 12
    tail -= alpha * (alpha + 1) * (alpha + 2) * n ** (-alpha - 3) / 720
    return head + tail


class FrequentWordsPlan(KindPlan["FrequentWordsTask"]):
    def __init__(self, task: FrequentWordsTask, index: int):
        super().__init__(task, index)
        ctx = task.ctx
        rng = np.random.default_rng(ctx.seed_for(index, "sample"))
        vocabulary = self._vocabulary(rng, task.vocab_size, task.word_length)
        vocabulary[0] = NOISE_WORD
        self.vocabulary = np.asarray(vocabulary, dtype=object)
        self.outputs = vocabulary[1:4]
        self.prefix = FWE_PREFIX
        self.head = ctx.head(task.head)
        self.tail = ctx.tail(task.tail, self.prefix)
        self.min_size = task.min_size
        self._tokens = np.zeros(0, dtype=np.int64)

    @staticmethod
    def _vocabulary(rng: np.random.Generator, size: int, length: int) -> list[str]:
        """`size` distinct random lower-case words of `length` letters, in random order."""
        words: dict[str, None] = {}
        while len(words) < size:
            codes = rng.integers(ord("a"), ord("z") + 1, size=(size - len(words), length), dtype=np.uint8)
            words.update(dict.fromkeys(codes.view(f"S{length}").ravel().astype(f"U{length}").tolist()))
        return list(words)

    def _word_tokens(self, ranks: int) -> np.ndarray:
        """Tokens of " word" for the first `ranks` ranks (only words that occur are ever counted)."""
        if len(self._tokens) < ranks:
            ranks = min(len(self.vocabulary), max(ranks, 2 * len(self._tokens)))
            fresh = self.ctx.counter.spaced([" " + word for word in self.vocabulary[len(self._tokens) : ranks]])
            self._tokens = np.concatenate([self._tokens, np.asarray(fresh, dtype=np.int64)])
        return self._tokens

    def _counts(self, size: int) -> tuple[np.ndarray, int]:
        counts = (size * self.task.weights).astype(np.int64)  # each rank's occurrences, truncated as the script does
        used = int(np.count_nonzero(counts))  # ranks are in decreasing frequency
        tokens = int(counts[:used] @ self._word_tokens(used)[:used])
        return counts[:used], tokens

    def _block(self, size: int, shuffled: bool) -> Block:
        counts, tokens = self._counts(size)
        vocabulary = self.vocabulary
        if shuffled:
            ranks = np.repeat(np.arange(len(counts)), counts)
            ranks = ranks[np.random.default_rng(self.position_seed ^ size).permutation(len(ranks))]
            first, last = int(ranks[0]), ranks[-4:].tolist()
            render = lambda: " " + " ".join(vocabulary[ranks].tolist())  # noqa: E731
        else:  # for the search: in rank order, never written out
            first, last = 0, [len(counts) - 1]
            render = lambda: ""  # noqa: E731
        tail = "".join(" " + vocabulary[rank] for rank in last)[-LEFT_CONTEXT_CHARS:]
        return Block(" " + vocabulary[first], tokens - int(self._tokens[first]), tail, render)

    def items(self, size: int) -> list[Item]:
        return [self.head, self._block(size, shuffled=True), self.tail]

    def estimate(self, size: int) -> int:
        return compose_count(self.ctx.counter, [self.head, self._block(size, shuffled=False), self.tail], rough=True)

    def guess(self, budget: int) -> int:
        counts, tokens = self._counts(max(self.min_size, 1000))
        per_word = tokens / max(1, int(counts.sum()))
        return max(self.min_size, int(budget / max(per_word, 1e-9) / float(self.task.weights.sum())))


class FrequentWordsTask(KindTask):
    Plan = FrequentWordsPlan

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        params = ctx.spec.params
        self.word_length = params["coded_wordlen"]
        self.vocab_size = (ctx.length - ctx.spec.max_new_tokens) // 50  # NVIDIA: after the generation budget
        if self.vocab_size < max(ANSWER_RANKS):
            raise TaskDoesNotFit(ctx.spec.name, ctx.length, 50 * max(ANSWER_RANKS) + ctx.spec.max_new_tokens)
        alpha = params["alpha"]
        ranks = np.arange(1, self.vocab_size + 1, dtype=np.float64)
        self.weights = ranks**-alpha / zeta(alpha)
        self.head, self.tail = FWE_TEMPLATE.split(" {context}")  # every coded word carries its leading space
        # the fewest words from which on the answer ranks always strictly out-count the next rank (none past the last)
        weights = np.append(self.weights, 0.0)
        self.min_size = max(1, *(math.ceil(1.0 / (weights[rank - 1] - weights[rank])) for rank in ANSWER_RANKS))

    def coarse(self) -> Coarse:
        """NVIDIA's sizing (freq_words_extraction.py): words drawn, climbed from budget // word length
        in steps of budget // 32 (its budget: the length less the generation budget)."""
        return Coarse(max(1, self.ctx.budget // 32), origin=self.ctx.budget // self.word_length)
