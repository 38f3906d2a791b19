"""Token counts of prompts assembled from pieces, without re-tokenising whole prompts.

Tokenisation is local: how a piece (template part, haystack line or word, needle, list entry,
document) tokenises depends on itself and the few characters before it. So the tokens a piece
adds are counted once after the last LEFT_CONTEXT_CHARS characters before it and memoised; a
prompt's length is the sum over its pieces plus the special tokens, and sizing a sample costs
look-ups, not tokenisations. `generate` checks this against full tokenisations.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

LEFT_CONTEXT_CHARS = 16
# Pieces that start with a space are counted after this letter: a space followed by a
# non-space starts a new pre-token in byte-level BPE, tiktoken-style and SentencePiece
# tokenizers, so what came before does not matter there (checked by generate's verification).
SPACED_LEFT = "x"


class TokenCounter:
    """Counts tokens of `tokenizer` exactly as the engine feeds them (BOS included when added)."""

    def __init__(self, tokenizer, add_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._after: dict[tuple[str, str], int] = {}
        self._chunked: dict[str, tuple[str, int]] = {}
        self.tables: dict = {}  # per-tokenizer tables built by the generators (essay counts, word counts)
        self.specials = self._lengths([""], add_special_tokens)[0]

    def _lengths(self, texts: Sequence[str], special: bool) -> list[int]:
        if self._backend is not None:
            encode = getattr(self._backend, "encode_batch_fast", None) or self._backend.encode_batch
            return [len(encoding.ids) for encoding in encode(list(texts), add_special_tokens=special)]
        ids = self.tokenizer(list(texts), add_special_tokens=special)["input_ids"]
        return [len(row) for row in ids]

    def exact(self, texts: Sequence[str]) -> list[int]:
        """Full tokenisation: the ground truth the composed counts must equal."""
        return self._lengths(texts, self.add_special_tokens)

    def after_many(self, pairs: Iterable[tuple[str, str]]) -> list[int]:
        """Tokens each piece adds after its left text (an empty left means: at the start of the prompt)."""
        keys = [(left[-LEFT_CONTEXT_CHARS:], piece) for left, piece in pairs]
        memo = self._after
        missing = list(dict.fromkeys(key for key in keys if key not in memo))
        if missing:
            lefts = list(dict.fromkeys(left for left, _ in missing))
            lengths = self._lengths([left + piece for left, piece in missing] + lefts, False)
            left_length = dict(zip(lefts, lengths[len(missing) :]))
            for (left, piece), n in zip(missing, lengths):
                memo[(left, piece)] = n - left_length[left]
        return [memo[key] for key in keys]

    def after(self, left: str, piece: str) -> int:
        return self.after_many([(left, piece)])[0]

    def chunked(self, text: str) -> tuple[str, int]:
        """(text's first space chunk, tokens of all its other chunks): see `space_chunks`."""
        found = self._chunked.get(text)
        if found is None:
            chunks = space_chunks(text)
            found = self._chunked[text] = (chunks[0], sum(self.spaced(chunks[1:])))
        return found

    def spaced(self, pieces: Sequence[str]) -> list[int]:
        return self.after_many((SPACED_LEFT, piece) for piece in pieces)

    def stream_counts(self, pieces: Sequence[str], left: str = "") -> list[int]:
        """Tokens each piece adds when the pieces follow `left` and each other, in one tokenisation
        (a token belongs to the piece its first character lies in): for long runs such as essays."""
        if self._backend is None:
            lefts = [left] + [piece for piece in pieces[:-1]]
            return self.after_many(zip(lefts, pieces))
        import numpy as np

        encoding = self._backend.encode(left + "".join(pieces), add_special_tokens=False)
        starts = np.fromiter((start for start, _ in encoding.offsets), dtype=np.int64, count=len(encoding.ids))
        bounds = np.cumsum([len(left)] + [len(piece) for piece in pieces])
        starts = starts[starts >= len(left)]
        owner = np.searchsorted(bounds, starts, side="right") - 1
        return np.bincount(owner, minlength=len(pieces))[: len(pieces)].tolist()


@dataclass(frozen=True)
class Block:
    """A run of pieces counted in advance: `first` depends on what precedes the block, `rest` does not."""

    first: str
    rest: int
    tail: str  # the block's last characters: the left context of whatever follows
    render: Callable[[], str]  # the block's text, built only when the sample is written out


Item = str | Block

_WORD_START = re.compile(r"(?<=\S)(?= \S)")


@lru_cache(maxsize=1 << 16)
def space_chunks(text: str) -> tuple[str, ...]:
    """`text` cut before each single space between two non-spaces: "a b. c" -> ("a", " b.", " c").
    Chunks after the first start with a space: counted after SPACED_LEFT, shared wherever they recur."""
    return tuple(_WORD_START.split(text))


def compose_count(counter: TokenCounter, items: Sequence[Item], special: bool = True, rough: bool = False) -> int:
    """Tokens of "".join(items) (plus specials): each item's start counted after the one before.
    `rough` counts each start as if it began the text (no new junction to tokenise, so a search
    probes sizes by look-ups alone); it may be off by a token per junction."""
    pairs: list[tuple[str, str]] = []
    rest = 0
    left = ""
    for item in items:
        if isinstance(item, Block):
            opening, tokens, tail = item.first, item.rest, item.tail
        elif item:
            (opening, tokens), tail = counter.chunked(item), item
        else:
            continue
        pairs.append(("" if rough else left, opening))
        rest += tokens
        left = (left + tail[-LEFT_CONTEXT_CHARS:])[-LEFT_CONTEXT_CHARS:]
    return (counter.specials if special else 0) + sum(counter.after_many(pairs)) + rest


def compose_text(items: Sequence[Item]) -> str:
    return "".join(item.render() if isinstance(item, Block) else item for item in items)
