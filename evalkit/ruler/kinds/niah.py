"""Needle in a haystack (niah_*): needles `One of the special magic ... for KEY is: VALUE.`

Haystacks (NVIDIA's niah.py): `noise` repeats one line; `needle` is lines of distractor needles
with random keys and values; `essay` is essay words, with needles put between sentences at
depths drawn from 40 evenly spaced points over 0-100%. Noise and needle haystacks take needles
between lines at uniformly drawn line positions.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from evalkit.ruler.context import Context
from evalkit.ruler.counting import SPACED_LEFT, Item, TokenCounter
from evalkit.ruler.essay import EssayStream, _looks_like_path, essay_stream, load_essay_text
from evalkit.ruler.fitting import Coarse
from evalkit.ruler.kinds import KindPlan, KindTask, file_identity
from evalkit.ruler.layout import GrowingStream, RepeatedLine, Stream, stream_items
from evalkit.ruler.spec import NIAH_NEEDLE, NOISE_LINE
from evalkit.ruler.words import random_value, wonderwords_list

if TYPE_CHECKING:
    from evalkit.ruler.spec import TaskSpec

# np.round(np.linspace(0, 100, 40)).astype(int) in niah.py; no point lies on a .5 tie.
DEPTHS = tuple(round(k * 100 / 39) for k in range(40))
DATA_CONSTANTS = {"DEPTHS": DEPTHS}  # keyed into the cache (evalkit.ruler.kinds)


def data_identity(spec: TaskSpec, essays, qa_dir) -> list:
    """An essay haystack's essays (the built-in prose, a file, or text given as is); other haystacks read none."""
    if spec.params["haystack"] != "essay":
        return []
    if essays is None:
        return ["builtin-prose"]
    if isinstance(essays, Path) or _looks_like_path(str(essays)):
        return file_identity(Path(essays))
    return ["text", hashlib.sha256(str(essays).encode()).hexdigest()]


def prompt_templates(spec: TaskSpec) -> list[str]:
    """The task's template, and its singular rewrite (one value of one key asked for)."""
    return [spec.template, singular(spec.template)]


def singular(text: str) -> str:
    """niah.py's rewrite of the template and prefix when one value of one key is asked for."""
    for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        text = text.replace(old, new)
    return text


def needle_start(value_type: str) -> str:
    """A `needle` haystack line's fixed start: its newline and the needle's text before the key."""
    return "\n" + NIAH_NEEDLE.split(" {key}")[0].format(type_needle_v=value_type)


def join_queries(queries: list[str]) -> str:
    return queries[0] if len(queries) == 1 else ", ".join(queries[:-1]) + ", and " + queries[-1]


class ValuePool:
    """Random values of one type drawn and counted once per batch (fresh ones for each of a haystack's
    hundreds of lines would cost a full tokenisation per sample): a sample draws its distractors from
    them without replacement. Word keys need none: their words are counted once."""

    def __init__(self, counter: TokenCounter, kind: str, size: int, rng: random.Random, suffix: str):
        self.values = [random_value(kind, rng) for _ in range(size)]
        pieces = [" " + value + suffix for value in self.values]
        self.counts = np.asarray(counter.spaced(pieces), dtype=np.int64)
        self.pieces = np.asarray(pieces, dtype=object)
        self.tails = np.asarray([piece[-2:] for piece in pieces], dtype=object)


def word_key_tables(counter: TokenCounter) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Adjectives with the tokens of " adjective", nouns with the tokens of "-noun is:" after a letter."""
    if "word_keys" not in counter.tables:
        adjectives = np.asarray(wonderwords_list("adjectives"), dtype=object)
        nouns = np.asarray(wonderwords_list("nouns"), dtype=object)
        # The hyphen splits adjective from noun in every tokenizer family (checked like every junction).
        adjective_counts = np.asarray(counter.spaced([" " + adjective for adjective in adjectives]), dtype=np.int64)
        noun_counts = np.asarray(counter.after_many((SPACED_LEFT, f"-{noun} is:") for noun in nouns), dtype=np.int64)
        counter.tables["word_keys"] = (adjectives, adjective_counts, nouns, noun_counts)
    return counter.tables["word_keys"]


class DistractorStream(GrowingStream):
    """The `needle` haystack: lines of needles with random keys and values, none with a real key.
    A line is counted as its fixed start (after the previous line's last two characters, where a
    tokenizer may merge across the newline), then ` KEY is:` and ` VALUE.` (each after a space)."""

    block_size = 128

    def __init__(self, ctx: Context, seed: int, real_keys: set[str], pools: dict[str, ValuePool]):
        super().__init__(ctx.counter, "\n")
        self.rng = np.random.default_rng(seed)
        self.real_keys, self.pools = real_keys, pools
        self.real_key_pieces = {f" {key} is:" for key in real_keys}
        self.start = needle_start(ctx.spec.params["value_type"])
        # Each pool is taken in a random order of its own: draws without replacement.
        self.orders = {name: self.rng.permutation(len(pool.values)) for name, pool in pools.items()}
        self.used = dict.fromkeys(pools, 0)
        self.words = word_key_tables(ctx.counter) if "keys" not in pools else None
        self._parts: list[tuple[int, str]] = []  # (tokens of key and value pieces, last chars) per line
        self._rest: list[int] = []  # tokens of each line after its fixed start
        self._start_tokens: dict[str, int] = {}  # tokens of the fixed start after the previous line's end

    def _take(self, name: str, n: int) -> np.ndarray:
        order, used = self.orders[name], self.used[name]
        if used + n > len(order):  # pools are sized for the budget; wrap rather than fail if one runs out
            used = 0
        self.used[name] = used + n
        return order[used : used + n]

    def _keys(self, n: int) -> tuple[list[str], np.ndarray]:
        """n keys (as ` KEY is:` pieces) and their tokens, skipping any real key."""
        if self.words is None:
            pool = self.pools["keys"]
            drawn = self._take("keys", n + len(self.real_keys))
            picked = [int(i) for i in drawn if pool.values[i] not in self.real_keys][:n]
            return pool.pieces[picked].tolist(), pool.counts[picked]
        adjectives, adjective_counts, nouns, noun_counts = self.words
        a = self.rng.integers(len(adjectives), size=n)
        b = self.rng.integers(len(nouns), size=n)
        pieces = [f" {adjective}-{noun} is:" for adjective, noun in zip(adjectives[a].tolist(), nouns[b].tolist())]
        if self.real_key_pieces.intersection(pieces):  # rare: redraw the lines that took a real key
            for i, piece in enumerate(pieces):
                while piece in self.real_key_pieces:
                    a[i], b[i] = self.rng.integers(len(adjectives)), self.rng.integers(len(nouns))
                    piece = pieces[i] = f" {adjectives[a[i]]}-{nouns[b[i]]} is:"
        return pieces, adjective_counts[a] + noun_counts[b]

    def _next_block(self, start: int, size: int) -> list[str]:
        key_pieces, key_tokens = self._keys(size)
        values = self._take("values", size)
        pool = self.pools["values"]
        value_pieces = pool.pieces[values].tolist()
        tokens = (key_tokens + pool.counts[values]).tolist()
        self._parts.extend(zip(tokens, pool.tails[values].tolist()))
        self._rest.extend(tokens)
        return [self.start + key + value for key, value in zip(key_pieces, value_pieces)]

    def split(self, j: int) -> tuple[str, int]:
        self.ensure(j + 1)
        return self.start, self._rest[j]

    def _count_block(self, pieces: list[str], left: str) -> list[int]:
        parts = self._parts[-len(pieces) :]
        lefts = [left[-2:]] + [tail for _, tail in parts[:-1]]
        starts = self._start_tokens
        for previous in dict.fromkeys(lefts):
            if previous not in starts:
                starts[previous] = self.counter.after(previous, self.start)
        return [starts[previous] + tokens for previous, (tokens, _) in zip(lefts, parts)]


class NiahPlan(KindPlan["NiahTask"]):
    def __init__(self, task: NiahTask, index: int):
        super().__init__(task, index)
        ctx, params = task.ctx, task.ctx.spec.params
        rng = ctx.rng(index)
        keys: list[str] = []
        values: list[list[str]] = []
        needles: list[tuple[str, tuple[int, int]]] = []  # each needle's text and (key, value) indices
        for i in range(params["num_keys"]):
            key = random_value(params["key_type"], rng)
            while key in keys:
                key = random_value(params["key_type"], rng)
            keys.append(key)
            values.append([random_value(params["value_type"], rng) for _ in range(params["num_values"])])
            needles += [(NIAH_NEEDLE.format(type_needle_v=params["value_type"], key=key, value=v), (i, j))
                        for j, v in enumerate(values[-1])]  # fmt: skip
        rng.shuffle(needles)  # the same draws as shuffling the texts alone (niah.py): only the length counts
        asked = rng.sample(range(params["num_keys"]), params["num_queries"])
        query = join_queries([keys[i] for i in asked])
        self.needles = [text for text, _ in needles]
        order = [ij for _, ij in needles]  # each output's needle, by its place in self.needles:
        self.carriers = [order.index((i, j)) for i in asked for j in range(params["num_values"])]
        self.outputs = [value for i in asked for value in values[i]]
        self.prefix = task.prefix_template.format(type_needle_v=task.type_shown, query=query)
        self.head = ctx.head(task.head)
        self.tail = ctx.tail(task.tail_template.format(type_needle_v=task.type_shown, query=query), self.prefix)
        self.stream: Stream
        self.min_size = len(needles)
        if task.kind == "essay":
            self.stream, self.min_size = task.stream, 1
            self.depths = rng.sample(DEPTHS, len(needles))
        elif task.kind == "noise":
            assert task.noise is not None  # built for the noise haystack
            self.stream = task.noise
        else:
            self.stream = DistractorStream(ctx, ctx.seed_for(index, "distractors"), set(keys), task.pools)

    def _insertions(self, size: int) -> list[tuple[int, str]]:
        if self.task.kind == "essay":
            # Needles go before the sentence at each depth, in order of depth (niah.py).
            assert isinstance(self.stream, EssayStream)
            starts = self.stream.sentence_starts(size)
            count = len(starts)
            spots = sorted(int(count * (depth / 100)) for depth in self.depths)
            return [(int(starts[s]) if s < count else size, needle) for s, needle in zip(spots, self.needles)]
        return list(zip(self._lines(size), self.needles))

    def _lines(self, size: int) -> list[int]:
        """One distinct line position per needle, drawn afresh for each size (niah.py's random.sample)."""
        return sorted(random.Random(self.position_seed ^ size).sample(range(size), len(self.needles)))

    def answer_depths(self, size: int) -> list[float]:
        """Each output's needle depth: the drawn percent that placed it (essay), else the share of
        haystack lines before it; needles take depths (and lines) in sorted order, as _insertions."""
        if self.task.kind == "essay":
            placed = [float(depth) for depth in sorted(self.depths)]
        else:
            placed = [round(100 * line / size, 2) for line in self._lines(size)]
        return [placed[k] for k in self.carriers]

    def items(self, size: int) -> list[Item]:
        context = stream_items(self.stream, size, self._insertions(size), strip_first=self.task.kind == "essay")
        return [self.head, *context, self.tail]

    def per_unit(self) -> float:
        if isinstance(self.stream, RepeatedLine):
            return self.stream.per_unit
        assert isinstance(self.stream, GrowingStream)
        return self.stream.average(self.stream.block_size)


class NiahTask(KindTask):
    Plan = NiahPlan

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        params = ctx.spec.params
        template, prefix = ctx.spec.template, ctx.spec.answer_prefix
        self.type_shown = params["value_type"]
        if params["num_values"] * params["num_queries"] == 1:
            template, prefix = singular(template), singular(prefix)
            self.type_shown = self.type_shown[:-1]
        head, self.tail_template = template.split("{context}")
        self.kind = params["haystack"]
        if self.kind == "essay":
            # Words are " "-separated and the template's newline precedes the first one.
            self.head = head.format(type_needle_v=self.type_shown)
            self.stream = essay_stream(ctx.counter, load_essay_text(ctx.essays))
        else:
            # Lines carry their own leading newline; the template's newline becomes the first line's.
            self.head = head[:-1].format(type_needle_v=self.type_shown)
            self.noise = RepeatedLine(ctx.counter, NOISE_LINE) if self.kind == "noise" else None
        if self.kind == "needle":
            self.pools = self._pools(ctx)
        self.prefix_template = prefix

    @staticmethod
    def _pools(ctx: Context) -> dict[str, ValuePool]:
        """Pools holding more values than the most lines that can fit (every line costs >= its start + 2)."""
        params = ctx.spec.params
        start = needle_start(params["value_type"])
        # A stream draws whole blocks, so it may draw a block beyond the lines it uses.
        most_lines = ctx.budget // (ctx.counter.after("x.", start) + 2) + 2 * DistractorStream.block_size
        rng = ctx.rng(-1, "pools")
        pools = {"values": ValuePool(ctx.counter, params["value_type"], most_lines, rng, ".")}
        if params["key_type"] != "words":
            pools["keys"] = ValuePool(ctx.counter, params["key_type"], most_lines, rng, " is:")
        return pools

    def coarse(self) -> Coarse:
        """NVIDIA's step (niah.py): 500 essay words, or 25 lines of noise or needles (5 below 4096)."""
        if self.kind == "essay":
            return Coarse(500)
        return Coarse(25 if self.ctx.length >= 4096 else 5)
