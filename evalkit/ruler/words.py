"""Word lists and random values for the synthetic tasks, all drawn from caller-owned RNGs.

Keys and cwe words come from wonderwords' word lists (its data files, read directly: its random
API uses the global RNG); uuids are built from the caller's random.Random, never uuid.uuid4().
"""

from __future__ import annotations

import random
import re
import uuid
from functools import cache

_WORD_FILES = {"nouns": "nounlist.txt", "adjectives": "adjectivelist.txt", "verbs": "verblist.txt"}


class WordListsMissing(RuntimeError):
    """wonderwords is not installed; generators turn this into TaskDataMissing."""


@cache
def wonderwords_list(kind: str) -> tuple[str, ...]:
    """Sorted and without duplicates: a fixed order for seeded draws."""
    try:
        from importlib.resources import files

        text = (files("wonderwords") / "assets" / _WORD_FILES[kind]).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError) as error:
        raise WordListsMissing("the word lists come from the wonderwords package: pip install wonderwords") from error
    return tuple(sorted({line.strip() for line in text.splitlines() if line.strip()}))


def random_value(kind: str, rng: random.Random) -> str:
    """A 7-digit number, an adjective-noun pair (uniform over NVIDIA's product list without
    building its 6.2M entries) or a version-4 uuid."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return f"{rng.choice(wonderwords_list('adjectives'))}-{rng.choice(wonderwords_list('nouns'))}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {kind!r}")


@cache
def common_words_pool() -> tuple[str, ...]:
    return tuple(
        sorted(set(wonderwords_list("nouns")) | set(wonderwords_list("adjectives")) | set(wonderwords_list("verbs")))
    )


@cache
def extra_prose_words() -> tuple[str, ...]:
    """More words for cwe lengths that need more than wonderwords' ~8.7K: NVIDIA switches to a
    bundled English list; evalkit takes the lower-case words of its prose that wonderwords lacks."""
    from evalkit.corpus import prose_text

    known = set(common_words_pool())
    found = set(re.findall(r"(?<![\w.])[a-z]{3,}(?![\w.])", prose_text()))
    return tuple(sorted(found - known))
