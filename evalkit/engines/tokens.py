"""What every engine feeds, decided once so that engines cannot disagree: a prompt's tokens (BOS
included), lm-eval's (context, continuation) split, rolling perplexity windows, the anchor
paradigm's packed layout, and where a generation is cut at a stop string."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evalkit.attention import pack
from evalkit.attention.anchor import anchor_token_id
from evalkit.errors import UserError


def encode_prompt(tokenizer, prompt: str | Sequence[int], *, specials: bool = True) -> list[int]:
    """Text gets the tokenizer's special tokens (a BOS where it adds one; none with specials=False,
    for text inside a larger sequence: a document, a question); token ids are kept as they are.

    Text that already starts with the BOS token's text (a chat template that writes it) gets no
    second one: a doubled BOS is a silent accuracy loss, and RULER counts such prompts the same way.
    """
    if not isinstance(prompt, str):
        return [int(t) for t in prompt]
    bos = getattr(tokenizer, "bos_token", None)
    add_special_tokens = specials and not (bos and prompt.startswith(bos))
    return list(tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"])


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval splits them, with the context encoded as a prompt.

    Trailing spaces of the context move to the continuation (" Paris" is one token where "Paris"
    after a space is not); the whole string is encoded at once and the continuation is what
    follows the context's own encoding, so merges across the boundary are scored as the
    continuation. An empty context is the prefix token alone.
    """
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    context_ids = encode_prompt(tokenizer, context)
    whole_ids = encode_prompt(tokenizer, context + continuation)
    continuation_ids = whole_ids[len(context_ids) :]
    if not context_ids:  # a tokenizer without BOS and an empty context: condition on the prefix token
        context_ids = [anchor_token_id(tokenizer)]  # what conditions a text's first token
    return context_ids, continuation_ids


def rolling_windows(token_ids: Sequence[int], prefix_id: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """(context, continuation) windows that score every token of `token_ids` exactly once.

    The sequence [prefix] + tokens is scored in consecutive chunks of max_length targets; each
    chunk is fed with as much preceding text as fits the window (a full window of context for
    the last, shorter chunk), so no window feeds more than max_length tokens. This is
    lm-evaluation-harness's rolling scheme (context_len=1), which keeps perplexities comparable.
    """
    sequence = [prefix_id, *token_ids]
    windows = []
    for start in range(1, len(sequence), max_length):
        end = min(start + max_length, len(sequence))
        first_fed = max(0, end - 1 - max_length)
        windows.append((sequence[first_fed:start], sequence[start:end]))
    return windows


@dataclass
class PackedLayout:
    """One packed request as token ids: [anchor] d1 [EOS] d2 [EOS] ... question, positions 0..n-1."""

    input_ids: list[int]
    doc_ids: list[int]  # for the document part: 0 for the anchor, 1.. per document
    num_document_tokens: int  # anchor and documents with their EOS; the question follows

    @property
    def question_ids(self) -> list[int]:
        return self.input_ids[self.num_document_tokens :]


def packed_layout(tokenizer, documents: Sequence[str | Sequence[int]], question: str | Sequence[int]) -> PackedLayout:
    """Lay documents out exactly as `evalkit.attention.pack(..., paradigm="anchor")`, then the question."""
    if tokenizer.eos_token_id is None:
        raise UserError("packed requests end every document with EOS, and the tokenizer has none")
    docs = [encode_prompt(tokenizer, doc, specials=False) for doc in documents]
    if not docs or any(not doc for doc in docs):
        raise UserError("a packed request needs at least one document, and no document may be empty")
    question_ids = encode_prompt(tokenizer, question, specials=False)
    if not question_ids:
        raise UserError("a packed request needs a non-empty question: it is what attends to every document")
    num_document_tokens = 1 + sum(len(doc) + 1 for doc in docs)  # the anchor, each document and its EOS
    packed = pack(docs, num_document_tokens, "anchor", bos_id=anchor_token_id(tokenizer), eos_id=tokenizer.eos_token_id)
    return PackedLayout(
        input_ids=packed.input_ids.tolist() + question_ids,
        doc_ids=packed.doc_ids.tolist(),
        num_document_tokens=num_document_tokens,
    )


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """`text` up to (not including) the earliest occurrence of any non-empty stop string."""
    cuts = [index for s in stop if s and (index := text.find(s)) >= 0]
    return text[: min(cuts)] if cuts else text


def end_of_generation_ids(tokenizer, config, model_path: Path) -> set[int]:
    """Every id that ends a generation, in both engines: the tokenizer's EOS, the model config's and
    generation_config.json's (each an id, a list of ids, or None)."""
    values = [tokenizer.eos_token_id, getattr(config, "eos_token_id", None)]
    generation_config = model_path / "generation_config.json"
    if generation_config.is_file():
        values.append(json.loads(generation_config.read_text()).get("eos_token_id"))
    return {int(v) for value in values for v in ([value] if isinstance(value, int) else value or [])}
