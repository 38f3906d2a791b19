"""What every task generator gets: the task, tokenizer counts, target length, seed and data."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from evalkit.ruler.counting import TokenCounter
from evalkit.ruler.fitting import derive_seed
from evalkit.ruler.prompt import PromptFormat
from evalkit.ruler.spec import TaskSpec


@dataclass(frozen=True)
class Context:
    spec: TaskSpec
    counter: TokenCounter
    length: int
    seed: int
    fmt: PromptFormat
    essays: str | Path | None = None
    qa_dir: str | Path | None = None

    @property
    def budget(self) -> int:
        """Prompt tokens allowed: the target length less the task's generation budget."""
        return self.length - self.spec.max_new_tokens

    def seed_for(self, index: int, purpose: str) -> int:
        # Not the length: a sample draws the same needles, chains and words at every length, so
        # lengths differ only in haystack, and the length a sample needs does not move with it.
        return derive_seed(self.seed, self.spec.name, index, purpose)

    def rng(self, index: int, purpose: str = "sample") -> random.Random:
        """Index -1: choices shared by the whole batch."""
        return random.Random(self.seed_for(index, purpose))

    # The prompt's first and last pieces: the format's wrapping around the task text.
    def head(self, text: str) -> str:
        return self.fmt.before + text

    def tail(self, text: str, prefix: str) -> str:
        return text + self.fmt.between + prefix
