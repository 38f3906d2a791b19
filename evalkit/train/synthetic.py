"""Synthetic documents that teach retrieval: facts stated early, asked for late, in prose filler.

A tiny model learns long-context retrieval only from a dense signal: each document hides a
few key -> number facts at random depths inside English filler and ends by asking for some of
them, so the answer tokens are predictable only by looking back across the document. The
phrasings are this project's own, not RULER's templates; they share the generic shape
"... for KEY is: VALUE" with most key-value retrieval tasks, RULER's needles included.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from functools import cache
from itertools import accumulate

from evalkit.corpus.prose import prose_documents

SYNTHETIC_VERSION = 3
CHARS_PER_TOKEN = 3.6  # the built-in BPE on this prose; only sizes documents roughly

# Facts name the key and then give the value after "is:", the shape a look-up can learn to
# copy from; the wording around it varies so the model cannot rely on one template.
FACT_TEMPLATES = (
    "The number for {key} is: {value}.",
    "The code for {key} is: {value}.",
    "Remember that the value for {key} is: {value}.",
)
QUESTION_TEMPLATES = (
    "What is the number for {key}? The number for {key} is: {value}.",
    "Question: which code belongs to {key}? Answer: the code for {key} is: {value}.",
    "Recall the value for {key}. The value for {key} is: {value}.",
)
# Phrasing "varied": the same look-up said in more ways, so that a model learns to find the key
# wherever the question puts it, not one template: single-word or hyphenated keys, several
# nouns, words between the key and the value, the value after "is" or "is:".
VARIED_NOUNS = ("number", "code", "value", "id number", "secret number")
VARIED_FACTS = (
    "The {noun} for {key} is: {value}.",
    "The {noun} assigned to {key} is {value}.",
    "Note that {key} has the {noun} {value}.",
    "Remember: the {noun} of {key} is: {value}.",
)
VARIED_QUESTIONS = (
    "What is the {noun} for {key}{clause}?",
    "Which {noun} belongs to {key}?",
    "Recall the {noun} of {key}.",
)
VARIED_ANSWERS = (
    "The {noun} for {key}{clause} is{colon} {value}.",
    "Answer: the {noun} of {key}{clause} is{colon} {value}.",
)
VARIED_CLAUSES = ("", "", " given above", " in this text", " that was stated earlier", " from the document above")
# Phrasing "broad": varied's forms and more: more nouns (among them RULER's "special magic
# number"), facts stated as "one of the ...s for", more clauses. A 1.3M model trained on varied
# did not carry the look-up over to a noun and clause it never saw (RULER's niah at 1K: the same
# number to most needles), so this corpus names them; results/README.md says so beside the scores.
BROAD_NOUNS = VARIED_NOUNS + (
    "special number",
    "magic number",
    "special magic number",
    "lucky number",
    "pass code",
    "key number",
    "hidden value",
)
BROAD_FACTS = VARIED_FACTS + ("One of the {noun}s for {key} is: {value}.", "The {noun} for {key} is {value}.")
BROAD_CLAUSES = VARIED_CLAUSES + (" mentioned in the provided text", " mentioned above", " in the provided text")
# Each phrasing beyond plain: (nouns, ways to state a fact, clauses between key and value).
WORDINGS = {"varied": (VARIED_NOUNS, VARIED_FACTS, VARIED_CLAUSES), "broad": (BROAD_NOUNS, BROAD_FACTS, BROAD_CLAUSES)}
PHRASINGS = ("plain", *WORDINGS)
FILLER_LINE_SHARE = 1 / 3  # of documents whose filler is plain repeated lines instead of prose
# Plain repeated filler (besides prose) so a document can be mostly distance with little content.
FILLER_LINES = (
    "The river is wide and the road is long.",
    "The hills are quiet and the stones are grey.",
    "Here the story goes on as before.",
    "Nothing new happens for a while.",
)


@cache
def _sentences() -> tuple[str, ...]:
    text = " ".join(" ".join(doc.split()) for doc in prose_documents())
    return tuple(s for s in re.split(r"(?<=[.!?])\s+", text) if 20 <= len(s) <= 400)


@cache
def _words() -> tuple[str, ...]:
    words = {w.lower() for w in re.findall(r"\b[a-zA-Z]{4,9}\b", " ".join(prose_documents()))}
    return tuple(sorted(words))


def _filler(rng: random.Random, chars: int) -> list[str]:
    """Prose sentences from a random place, or (a third of the time) plain repeated lines."""
    if rng.random() < FILLER_LINE_SHARE:
        line = rng.choice(FILLER_LINES)
        return [line] * max(1, chars // (len(line) + 1))
    sentences = _sentences()
    start = rng.randrange(len(sentences))
    out: list[str] = []
    size = 0
    while size < chars:
        sentence = sentences[(start + len(out)) % len(sentences)]
        out.append(sentence)
        size += len(sentence) + 1
    return out


@dataclass(frozen=True)
class RetrievalExample:
    """A synthetic document and, as character spans of `text`, where each asked value is first
    stated (`facts[k]`: a random number, unpredictable) and where the closing questions repeat it
    (`answers[k]`: predictable only by looking back), the pair a retrieval check compares."""

    text: str
    facts: tuple[tuple[int, int], ...]
    answers: tuple[tuple[int, int], ...]


def retrieval_example(index: int, seed: int, max_tokens: int, phrasing: str = "plain") -> RetrievalExample:
    """Retrieval document `index` (deterministic in the arguments) with its value spans: up to 12
    key -> 7-digit facts at random depths of the filler, then questions about some of them, each
    answered, worded as `phrasing` (PHRASINGS) says."""
    varied = phrasing != "plain"
    rng = random.Random(
        f"retrieval-{SYNTHETIC_VERSION}-{seed}-{index}" + ("" if phrasing == "plain" else f"-{phrasing}")
    )
    # Log-uniform length: many short documents and some that span a whole window.
    tokens = round(2 ** rng.uniform(6, max(6.5, math.log2(max_tokens * 0.9))))
    filler = _filler(rng, int(tokens * CHARS_PER_TOKEN))
    num_facts = rng.randint(1, 12)
    facts = [(_key(rng, varied), str(rng.randrange(10**6, 10**7))) for _ in range(num_facts)]
    stated = {}
    for key, value in facts:
        position = rng.randint(0, len(filler))  # drawn before the template: the stream's order
        stated[value] = _fact(rng, key, value, phrasing)
        filler.insert(position, stated[value])
    asked = rng.sample(facts, rng.randint(max(1, num_facts // 2), num_facts))
    questions = [_question(rng, key, value, phrasing) for key, value in asked]
    body = " ".join(filler)
    text = body + "\n" + "\n".join(questions)
    fact_spans, answer_spans, start = [], [], len(body) + 1
    for (_, value), question in zip(asked, questions):
        answer = start + question.rindex(value)  # every question template ends with its value
        fact = _sentence_start(filler, stated[value]) + stated[value].index(value)
        fact_spans.append((fact, fact + len(value)))
        answer_spans.append((answer, answer + len(value)))
        start += len(question) + 1
    return RetrievalExample(text, tuple(fact_spans), tuple(answer_spans))


def _key(rng: random.Random, varied: bool) -> str:
    words = _words()
    if varied and rng.random() < 0.5:
        return rng.choice(words)
    return f"{rng.choice(words)}-{rng.choice(words)}"


def _fact(rng: random.Random, key: str, value: str, phrasing: str) -> str:
    if phrasing == "plain":
        return rng.choice(FACT_TEMPLATES).format(key=key, value=value)
    nouns, facts, _ = WORDINGS[phrasing]
    return rng.choice(facts).format(noun=rng.choice(nouns), key=key, value=value)


def _question(rng: random.Random, key: str, value: str, phrasing: str) -> str:
    """A question and its answer sentence, which ends with the value."""
    if phrasing == "plain":
        return rng.choice(QUESTION_TEMPLATES).format(key=key, value=value)
    nouns, _, clauses = WORDINGS[phrasing]
    noun, clause = rng.choice(nouns), rng.choice(clauses)
    question = rng.choice(VARIED_QUESTIONS).format(noun=noun, key=key, clause=clause)
    colon = rng.choice((":", ""))
    answer = rng.choice(VARIED_ANSWERS).format(noun=noun, key=key, clause=clause, colon=colon, value=value)
    return f"{question} {answer}"


def _sentence_start(pieces: list[str], sentence: str) -> int:
    """Character offset of `sentence` (compared by identity) in " ".join(pieces)."""
    offset = 0
    for piece in pieces:
        if piece is sentence:
            return offset
        offset += len(piece) + 1
    raise ValueError("sentence not among the pieces")


# Copy documents: the induction skill alone, densely. A model copies by content only after a
# long plateau (results/tiny-recipe: ~18M tokens for a 2-layer model on random tokens); retrieval
# documents carry that signal on a few answer digits each, copy documents on a third of their tokens.
COPY_SEGMENT_ITEMS = (3, 10)
COPY_GAP_ITEMS = (0, 24)
TOKENS_PER_COPY_ITEM = 3  # words of 4-9 letters and numbers of 1-7 digits, on the built-in BPE


def _copy_item(rng: random.Random) -> str:
    """A random word, or a number of 1-7 digits (the built-in BPE splits digits one by one)."""
    if rng.random() < 0.5:
        return rng.choice(_words())
    digits = rng.randint(1, 7)
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def copy_example(index: int, seed: int, max_tokens: int) -> RetrievalExample:
    """Copy document `index` (deterministic in the arguments): random items in segments, each
    repeated after a random gap, so predictable only by finding its earlier occurrence by content.
    `answers` span each repeat from its second item on (the first cannot be foreseen), `facts` the
    same items where they first occur (the control)."""
    rng = random.Random(f"copy-{SYNTHETIC_VERSION}-{seed}-{index}")
    tokens = round(2 ** rng.uniform(6, max(6.5, math.log2(max_tokens * 0.9))))
    items: list[str] = []
    first, repeat = [], []  # item ranges [start, end) of each segment's two occurrences
    while len(items) * TOKENS_PER_COPY_ITEM < tokens:
        segment = [_copy_item(rng) for _ in range(rng.randint(*COPY_SEGMENT_ITEMS))]
        gap = [_copy_item(rng) for _ in range(rng.randint(*COPY_GAP_ITEMS))]
        first.append((len(items) + 1, len(items) + len(segment)))
        repeat.append((len(items) + len(segment) + len(gap) + 1, len(items) + 2 * len(segment) + len(gap)))
        items += segment + gap + segment
    starts = list(accumulate((len(item) + 1 for item in items), initial=0))  # of each item in the text

    def span(item_range: tuple[int, int]) -> tuple[int, int]:  # characters of items [a, b)
        a, b = item_range
        return starts[a], starts[b] - 1

    return RetrievalExample(" ".join(items), tuple(map(span, first)), tuple(map(span, repeat)))
