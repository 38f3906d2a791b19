"""Built-in English prose: the language reference topics that ship with every CPython.

`pydoc_data.topics` holds about 465K characters of English documentation prose (with some
code). It is the one sizeable English text on every machine with Python, so it serves the
tiny models' training corpus and RULER's default essay haystack without any download.
"""

from __future__ import annotations

import re
from functools import cache

MAX_DOC_CHARS = 2400  # topics are cut at paragraph breaks into documents of about this size


def _clean(text: str) -> str:
    text = re.sub(r"[ \t]+\n", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


@cache
def prose_documents() -> tuple[str, ...]:
    """The prose as documents of at most ~MAX_DOC_CHARS characters, in a fixed order."""
    from pydoc_data.topics import topics

    docs = []
    for _name, body in sorted(topics.items()):
        current: list[str] = []
        size = 0
        for paragraph in _clean(body).split("\n\n"):
            if current and size + len(paragraph) > MAX_DOC_CHARS:
                docs.append("\n\n".join(current))
                current, size = [], 0
            current.append(paragraph)
            size += len(paragraph) + 2
        if current:
            docs.append("\n\n".join(current))
    return tuple(docs)


@cache
def prose_text() -> str:
    """All of the prose as one text (RULER's default essay haystack)."""
    return "\n\n".join(prose_documents())
