"""The essay haystack: a text cut into words, with sentence starts and per-word token counts.

NVIDIA takes the first N words of Paul Graham's essays (repeated when N exceeds them), splits
them into sentences with NLTK and inserts needles between sentences. evalkit does the same on any
essay text (built-in prose by default) with a rule-based splitter: NLTK's punkt needs a download.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

from evalkit.ruler.counting import TokenCounter
from evalkit.ruler.layout import GrowingStream

# A word ends a sentence when it ends with . ! or ? (closing quotes/brackets allowed), is not a
# common abbreviation, and the next word starts like a sentence does.
_SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*$")
_SENTENCE_START = re.compile(r"^[\"'\u201c\u2018(\[]*[A-Z0-9]")
_ABBREVIATIONS = frozenset({"e.g.", "i.e.", "etc.", "vs.", "mr.", "mrs.", "ms.", "dr.", "st.", "cf.", "no.", "fig."})


class EssayError(ValueError):
    """The essay source cannot be used; generators turn this into TaskDataMissing."""


def load_essay_text(essays: str | Path | None) -> str:
    """The haystack text: built-in prose, a text file, a JSON file of essays, or the text itself."""
    if essays is None:
        from evalkit.corpus import prose_text

        return prose_text()
    path = Path(essays) if isinstance(essays, Path) or _looks_like_path(essays) else None
    if path is None:
        text = str(essays)
    elif not path.is_file():
        raise EssayError(f"essay file {path} not found: pass an existing .txt or .json file, or the text itself")
    elif path.suffix.lower() == ".json":
        text = _essays_from_json(path)
    else:
        text = path.read_text(encoding="utf-8")
    if len(text.split()) < 2:
        raise EssayError("the essay text is empty: pass a file or text with at least a few sentences")
    return text


def _looks_like_path(value: str) -> bool:
    return "\n" not in value and len(value) < 4096 and (value.endswith((".txt", ".json", ".md")) or "/" in value)


def _essays_from_json(path: Path) -> str:
    """{"text": str | [str]} (NVIDIA's PaulGrahamEssays.json), [str], or [{"text"|"content": str}]."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise EssayError(f"essay file {path} is not valid JSON ({error.msg} at line {error.lineno})") from error
    if isinstance(data, dict):
        data = data.get("text", data.get("essays"))
    if isinstance(data, str):
        return data
    if isinstance(data, list):
        # each a string or {"text"|"content": str}; anything else (a number, a list, null) is refused below
        texts = [(item.get("text") or item.get("content")) if isinstance(item, dict) else item for item in data]
        strings = [text for text in texts if isinstance(text, str)]
        if strings and len(strings) == len(texts):
            return "\n\n".join(strings)
    raise EssayError(f'essay file {path} must hold {{"text": ...}}, a list of strings, or a list of {{"text": ...}}')


def essay_words(text: str) -> list[str]:
    return re.sub(r"\s+", " ", text).strip().split(" ")


def sentence_starts(words: list[str]) -> np.ndarray:
    """Indices of the words that begin a sentence (0 always does)."""
    starts = [0]
    for j in range(1, len(words)):
        previous = words[j - 1]
        if (
            _SENTENCE_END.search(previous)
            and previous.lower() not in _ABBREVIATIONS
            and _SENTENCE_START.match(words[j])
        ):
            starts.append(j)
    return np.asarray(starts, dtype=np.int64)


class EssayStream(GrowingStream):
    """The essay's words, repeated end to end as often as needed; unit j is " " + word."""

    block_size = 4096

    def __init__(self, counter: TokenCounter, text: str):
        super().__init__(counter, " ")
        self.words = essay_words(text)
        self._cycle_starts = sentence_starts(self.words)
        self._starts: np.ndarray | None = None
        self._starts_upto = 0

    def _next_block(self, start: int, size: int) -> list[str]:
        words, total = self.words, len(self.words)
        return [" " + words[j % total] for j in range(start, start + size)]

    def _count_block(self, pieces: list[str], left: str) -> list[int]:
        # One tokenisation per block of words; each word's tokens found from character offsets.
        return self.counter.stream_counts(pieces, left)

    def sentence_starts(self, n: int) -> np.ndarray:
        """Word indices < n that begin a sentence, over as many repeats of the essay as n spans."""
        total = len(self.words)
        if self._starts is None or self._starts_upto < n:
            cycles = max(1, -(-2 * n // total))
            self._starts = (np.arange(cycles)[:, None] * total + self._cycle_starts[None, :]).ravel()
            self._starts_upto = cycles * total
        return self._starts[: int(np.searchsorted(self._starts, n))]


def essay_stream(counter: TokenCounter, text: str) -> EssayStream:
    """The stream for this text and tokenizer, counted once per process."""
    key = ("essay", hashlib.sha256(text.encode()).hexdigest())
    if key not in counter.tables:
        counter.tables[key] = EssayStream(counter, text)
    return counter.tables[key]
