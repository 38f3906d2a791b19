"""`ppl` tokenizes a prefix of each document, not the whole: the ids it scores equal the first L of
tokenizing the whole document (the reference, computed here), cuts mid-word, mid-number, inside
whitespace runs and inside multi-token characters included, and the tokenizer never reads more
than a bound proportional to L, however long the document."""

from __future__ import annotations

import json

import pytest

from evalkit import ppl
from evalkit.models.refs import resolve_checkpoints
from evalkit.sweep.pipeline import run_benchmark
from tests.test_ppl import TINY, _reference

DOCUMENTS = [
    "\n\n".join(ppl.builtin_documents())[:20_000],  # prose
    "naïve café — 日本語のテキストを読む 🙂👍🏽👨‍👩‍👧 Ωμέγα. " * 200,  # characters of several tokens each
    "supercalifragilistic" * 300 + " " + "a" * 3000,  # words far longer than a prefix's slack
    ("x" + " " * 37 + "\n\n\t  " + "12345678901234567890") * 200,  # whitespace runs and long numbers
]


def _whole(tokenizer, text: str) -> list[int]:
    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    return bos + tokenizer(text, add_special_tokens=False)["input_ids"]


class _NoBos:
    """The same tokenizer, as one without a BOS."""

    bos_token_id = None

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, text, **kwargs):
        return self.tokenizer(text, **kwargs)


def _mismatches(tokenizer, limits) -> int:
    """How many (document, L) give ids other than the whole document's first L."""
    wholes = [_whole(tokenizer, text) for text in DOCUMENTS]
    return sum(ppl.document_tokens(tokenizer, t, n) != w[:n] for t, w in zip(DOCUMENTS, wholes) for n in limits)


@pytest.mark.parametrize("bos", [True, False])
def test_the_tokens_scored_equal_the_whole_documents_first_tokens(tokenizer, monkeypatch, bos):
    tokenizer = tokenizer if bos else _NoBos(tokenizer)
    assert _mismatches(tokenizer, (1, 2, 3, 17, 100, 1000, 5000, 10**6)) == 0  # 10**6: all, shorter than L
    # A first prefix of 1 character per token needed: prefixes grow from too short, and the cut
    # falls just past the tokens kept, at every kind of place (without the slack, ids differ there).
    monkeypatch.setattr(ppl, "PREFIX_CHARS", 1)
    assert _mismatches(tokenizer, range(1, 1200, 5)) == 0
    monkeypatch.setattr(ppl, "PREFIX_SLACK", 0)
    assert _mismatches(tokenizer, range(1, 1200, 5)) > 0  # the check above reaches cuts that matter


def test_the_tokenizer_reads_a_bounded_prefix_of_a_huge_document(tmp_path, monkeypatch):
    """Through `ppl` itself: a one-line document of 0.9 M characters scored at 128 and 256 tokens; every call of
    the tokenizer counted; the perplexity equals a plain forward over the whole document's tokens."""
    from evalkit.models.check import load_tokenizer

    huge = ("\n\n".join(ppl.builtin_documents()).replace("\n", " ") * 2)[:1_500_000]
    data = tmp_path / "huge.jsonl"
    data.write_text(json.dumps({"text": huge}) + "\n" + json.dumps({"text": DOCUMENTS[1] * 10}) + "\n")
    cls = type(load_tokenizer(TINY))
    real, read = cls.__call__, []

    def counting(self, text, *args, **kwargs):
        read.append(len(text) if isinstance(text, str) else sum(map(len, text)))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(cls, "__call__", counting)
    settings = ppl.PplSettings(lengths=[128, 256], data=str(data), docs=2, dtype="fp32", batch_size=2)
    run = run_benchmark(ppl.PplBenchmark(settings), resolve_checkpoints([str(TINY)]), tmp_path / "out")
    assert read and max(read) <= 64 * 256  # 0.9 M characters in the document
    monkeypatch.setattr(cls, "__call__", real)
    for row in run.result_rows():
        expected, used, _ = _reference(TINY, [huge, DOCUMENTS[1] * 10], row.length)
        assert (row.value, row.n) == (pytest.approx(expected, rel=1e-4), used) and used == 2
