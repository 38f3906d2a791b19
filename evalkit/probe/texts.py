"""The probe's input texts as token windows, each starting as the tokenizer starts a text.

The built-in English prose (default) or a plain-text file's paragraphs are tokenised,
concatenated and cut into consecutive windows; a JSONL file's "text" fields are tokenised one by
one and cut to the window length (texts shorter than that are skipped and counted). The first
token is the attention sink the paper studies: every window begins with what the tokenizer puts
before a text (Llama's BOS `<s>`, nothing for Qwen2), and the probe records whether it is a BOS.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from evalkit.errors import UserError
from evalkit.files import jsonl_texts, read_text


@dataclass(frozen=True)
class TokenWindows:
    """N windows of T token ids, and how many texts were too short to give one."""

    ids_NT: torch.Tensor
    skipped_short: int

    @property
    def count(self) -> int:
        return int(self.ids_NT.shape[0])


def special_prefix(tokenizer) -> list[int]:
    """The ids the tokenizer adds before a text's own tokens (e.g. [BOS]); may be empty."""
    probe_text = "The probe"
    plain = tokenizer(probe_text, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe_text, add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return list(full[:start])
    return []


class TextSource:
    """Token windows of any length from one source; tokenises only as much as it is asked for."""

    def __init__(self, tokenizer, path: Path | None = None, max_length: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.prefix = special_prefix(tokenizer)
        self.path = Path(path) if path is not None else None
        self._stream: list[int] = []
        self._pieces: Iterator[str] = iter(())
        self._texts: list[list[int]] | None = None
        if self.path is None:
            from evalkit.corpus import prose_documents

            self._pieces = iter(prose_documents())
        elif self.path.suffix == ".jsonl":
            encode = dict(add_special_tokens=True, truncation=max_length is not None, max_length=max_length)
            self._texts = [tokenizer(text, **encode)["input_ids"] for text in jsonl_texts(self.path, "--texts")]
        else:
            paragraphs = read_text(self.path, "--texts").split("\n\n")
            self._pieces = (paragraph for paragraph in paragraphs if paragraph.strip())

    def describe(self) -> str:
        return "built-in prose (evalkit.corpus)" if self.path is None else str(self.path)

    def first_token_is_bos(self) -> bool:
        bos = getattr(self.tokenizer, "bos_token_id", None)
        return bos is not None and self.prefix[:1] == [bos]

    def windows(self, length: int, count: int) -> TokenWindows:
        """Up to `count` windows of `length` tokens; a UserError when the source has none."""
        if self._texts is None:
            return self._windows_from_stream(length, count)
        long_enough = [ids[:length] for ids in self._texts if len(ids) >= length]
        if not long_enough:
            longest = max((len(ids) for ids in self._texts), default=0)
            raise UserError(
                f"no text in {self.path} has {length} tokens (the longest has {longest}): use a smaller length"
            )
        return TokenWindows(torch.tensor(long_enough[:count], dtype=torch.long), len(self._texts) - len(long_enough))

    def _extend_stream(self, tokens_needed: int) -> None:
        separator = self.tokenizer("\n\n", add_special_tokens=False)["input_ids"]
        while len(self._stream) < tokens_needed and (piece := next(self._pieces, None)) is not None:
            if self._stream:
                self._stream.extend(separator)
            self._stream.extend(self.tokenizer(piece, add_special_tokens=False)["input_ids"])

    def _windows_from_stream(self, length: int, count: int) -> TokenWindows:
        body = length - len(self.prefix)
        if body < 1:
            raise UserError(f"length {length} leaves no room for text after the tokenizer's special tokens")
        self._extend_stream(body * count)
        available = min(count, len(self._stream) // body)
        if available == 0:
            raise UserError(
                f"{self.describe()} has {len(self._stream)} tokens, fewer than one window of {length}: "
                "use a smaller length or a longer texts file"
            )
        windows = [self.prefix + self._stream[i * body : (i + 1) * body] for i in range(available)]
        return TokenWindows(torch.tensor(windows, dtype=torch.long), 0)
