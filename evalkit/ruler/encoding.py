"""`--encoding anchor`: RULER's samples cut into documents as the anchor paradigm reads packed
documents (docs/ruler.md): the instruction, then the context cut at line breaks, else sentence
ends, else spaces into pieces of about `doc_tokens` tokens (qa_1/qa_2: at their own "Document k:"
blocks), losslessly, or the unit is skipped. The engines' generate_packed lays them out.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from evalkit.errors import Skipped
from evalkit.ruler.kinds import task_kind

if TYPE_CHECKING:
    from evalkit.ruler.sample import Sample
    from evalkit.ruler.spec import TaskSpec

DEFAULT_DOC_TOKENS = 512
BOUNDARIES = ("\n", ". ", " ")  # where a context may be cut, in order of preference


@dataclass(frozen=True)
class Split:
    """A sample as documents and a question; joined, they are the standard prompt exactly."""

    documents: list[str]
    question: str  # the text after the context, then the answer prefix

    def text(self) -> str:
        return "".join(self.documents) + self.question


def split_sample(sample: Sample, spec: TaskSpec, tokenizer, doc_tokens: int) -> Split:
    """Skipped when the sample's text does not follow the task's template (written by something else)."""
    kind, text = task_kind(spec), sample.input
    # (instruction, context, question), by the first of its task's templates the text follows
    match = next(filter(None, (_template_regex(t).fullmatch(text) for t in kind.prompt_templates(spec))), None)
    if match is None:
        raise Skipped(f"{spec.name}: a sample's text does not follow the task's template, so its documents are unknown")
    head, context, tail = text[: match.start("context")], match.group("context"), text[match.end("context") :]
    pieces = kind.context_documents(context)
    if pieces is None:
        pieces = _cut(context, tokenizer, doc_tokens)
    documents = [head, *pieces] if head.strip() else pieces
    split = Split(_merge_blank(documents), tail + sample.answer_prefix)
    if split.text() != sample.input + sample.answer_prefix:  # lossless, or not used at all
        raise Skipped(f"{spec.name} sample {sample.index} could not be split into documents losslessly")
    return split


def _template_regex(template: str) -> re.Pattern:
    """Its context greedy (the question is the template's last text), every other placeholder lazy."""
    pattern, last = [], 0
    for field in re.finditer(r"\{(\w+)\}", template):
        pattern.append(re.escape(template[last : field.start()]))
        pattern.append("(?P<context>.*)" if field.group(1) == "context" else "(?:.+?)")
        last = field.end()
    pattern.append(re.escape(template[last:]))
    return re.compile("".join(pattern), re.DOTALL)


def _cut(text: str, tokenizer, doc_tokens: int) -> list[str]:
    """`text` in pieces of about doc_tokens tokens, each ending at a boundary (BOUNDARIES)."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = [start for start, _ in encoded["offset_mapping"]]
    if len(starts) <= doc_tokens:
        return [text]
    wanted = len(starts) // doc_tokens
    for boundary in BOUNDARIES:
        cuts = [match.end() for match in re.finditer(re.escape(boundary), text)]
        if len(cuts) >= wanted:
            break
    pieces, begin, begin_token = [], 0, 0
    for cut in cuts:
        token = bisect.bisect_left(starts, cut)  # tokens that start before the cut
        if token - begin_token >= doc_tokens and cut < len(text):
            pieces.append(text[begin:cut])
            begin, begin_token = cut, token
    pieces.append(text[begin:])
    return pieces


def _merge_blank(documents: list[str]) -> list[str]:
    """A piece of whitespace alone is no document: it joins the one before (or after, first)."""
    merged: list[str] = []
    for document in documents:
        if merged and not (document.strip() and merged[-1].strip()):
            merged[-1] += document
        else:
            merged.append(document)
    return merged
