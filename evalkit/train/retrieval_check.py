"""Has a model learned in-context retrieval? Answer-token accuracy on held-out synthetic documents,
beside the same value's first statement (unpredictable) as the control: docs/training.md's finer
signal than RULER, which stays at 0 until whole values come out right.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import torch

from evalkit.train.synthetic import PHRASINGS, RetrievalExample, copy_example, retrieval_example


def retrieval_kind(phrasing: str) -> str:
    """The check's kind for documents in `phrasing`: retrieval (plain), retrieval-varied, ..."""
    return "retrieval" if phrasing == "plain" else f"retrieval-{phrasing}"


EXAMPLES: dict[str, Callable[[int, int, int], RetrievalExample]] = {
    **{retrieval_kind(phrasing): partial(retrieval_example, phrasing=phrasing) for phrasing in PHRASINGS},
    "copy": copy_example,
}

HELD_OUT_FROM = 10_000_000  # document indices the training stream (num_retrieval_docs) never reaches
HELD_OUT_SEED = 12_345


def span_tokens(offsets: Sequence[tuple[int, int]], span: tuple[int, int]) -> list[int]:
    """Indices of the tokens lying inside the character span, except a first token (no context)."""
    start, end = span
    return [t for t, (a, b) in enumerate(offsets) if t > 0 and b > a and a >= start and b <= end]


def answer_accuracy(
    model, tokenizer, *, max_tokens: int, documents: int = 64, seed: int = HELD_OUT_SEED, kind: str = "retrieval"
) -> dict:
    """Teacher-forced accuracy and mean NLL on answer tokens and on first-statement tokens.

    kind: a key of EXAMPLES, the retrieval documents in each phrasing or the copy documents (whose
    answers are the repeated segments, the control their first occurrence). `model(input_ids)` must
    return `.logits` [1, T, V]; `tokenizer` must give offset mappings (a fast tokenizer). Documents
    longer than `max_tokens` are skipped.
    """
    make_example = EXAMPLES[kind]
    tally = {"answer": [0, 0, 0.0], "fact": [0, 0, 0.0]}  # correct, tokens, summed NLL
    used = 0
    for index in range(HELD_OUT_FROM, HELD_OUT_FROM + documents):
        example = make_example(index, seed, max_tokens)
        encoded = tokenizer(example.text, return_offsets_mapping=True)
        ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
        if len(ids) > max_tokens:
            continue
        used += 1
        with torch.no_grad():
            log_probs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        for role, spans in (("answer", example.answers), ("fact", example.facts)):
            for span in spans:
                for t in span_tokens(offsets, span):
                    tally[role][0] += int(log_probs[t - 1].argmax()) == ids[t]
                    tally[role][1] += 1
                    tally[role][2] -= float(log_probs[t - 1, ids[t]])
    result: dict[str, float | int] = {"documents": used}
    for role, (correct, tokens, nll) in tally.items():
        result[f"{role}_tokens"] = tokens
        result[f"{role}_accuracy"] = correct / tokens if tokens else math.nan
        result[f"{role}_nll"] = nll / tokens if tokens else math.nan
    return result


def check_retrieval(path: Path, max_tokens: int, documents: int, device: str = "cpu", kind: str = "retrieval") -> dict:
    """answer_accuracy of a checkpoint directory, run in FP32 on `device`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    # (ignore: transformers wraps PreTrainedModel.to with functools.wraps, which mypy types as unbound)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).to(device).eval()  # type: ignore[arg-type]
    forward = lambda input_ids: model(input_ids.to(device))  # noqa: E731
    return answer_accuracy(forward, tokenizer, max_tokens=max_tokens, documents=documents, kind=kind)
