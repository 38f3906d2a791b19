"""`ppl --key-tokens` is LongPPL as its reference implementation (PyPI `longppl` 0.3.0,
find_key_token and compute_longppl; aggregated over documents as the paper's perplexity.py)
defines it, the checkpoint as its own evaluator: checked against that definition written out here
with plain transformers forwards, on the tiny model with a short context of 64 and a stride of 16
(the reference's trunc_len and sliding_window are parameters; 4096 and 1024 by default)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from evalkit import ppl
from evalkit.models.refs import resolve_checkpoints
from evalkit.sweep.pipeline import run_benchmark
from tests.test_ppl import TINY, _anchor_reference, _data

CONTEXT, STRIDE = 64, 16
# The tiny models gain little from distant context: at the reference's alpha 2 and beta -2 they have
# no key token in these documents, so the checks lower both (the rule is the same; ~40 key tokens).
ALPHA, BETA = 0.1, -6.0


def _reference_key_tokens(model, ids: list[int], trunc_len: int, sliding_window: int, alpha=2.0, beta=-2.0):
    """(key positions, each position's full-context loss): find_key_token's loop over one text's
    ids. The full forward once; for start in range(0, n - trunc_len, sliding_window) the short
    input ids[start : start + trunc_len + window] (the last window cut to the text's end); the
    tokens at start + trunc_len .. are key where short loss - full loss > alpha and full loss < -beta."""
    import torch

    x = torch.tensor([ids])
    with torch.no_grad():
        full = model(input_ids=x).logits[0].double()
    loss = torch.nn.functional.cross_entropy(full[:-1], x[0, 1:], reduction="none")  # loss[t - 1]: token t's
    keys, n = [], len(ids)
    for start in range(0, n - trunc_len, sliding_window):
        window = min(sliding_window, n - start - trunc_len)
        short_ids = x[:, start : start + trunc_len + window]
        with torch.no_grad():
            short = model(input_ids=short_ids).logits[0].double()
        loss_short = torch.nn.functional.cross_entropy(
            short[trunc_len - 1 : trunc_len + window - 1], short_ids[0, trunc_len:], reduction="none"
        )
        loss_full = loss[start + trunc_len - 1 : start + trunc_len + window - 1]
        chosen = torch.logical_and(loss_short - loss_full > alpha, loss_full < -beta)
        keys += [start + trunc_len + i for i in range(window) if chosen[i]]
    return keys, loss.tolist()


def _reference_longppl(per_document: list[list[float]]) -> float | None:
    """Each document's exp(mean loss over its key tokens), weighted by its key tokens (perplexity.py)."""
    keyed = [losses for losses in per_document if losses]
    total = sum(len(losses) for losses in keyed)
    return sum(len(ls) * math.exp(sum(ls) / len(ls)) for ls in keyed) / total if total else None


def _tokens(path: Path, texts: list[str], length: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = [[tokenizer.bos_token_id, *tokenizer(t, add_special_tokens=False)["input_ids"]] for t in texts]
    return [row[:length] for row in rows if len(row) >= length]


def _run(tmp_path: Path, monkeypatch, lengths: list[int], **more):
    for name, value in (("KEY_CONTEXT", CONTEXT), ("KEY_STRIDE", STRIDE), ("KEY_ALPHA", ALPHA), ("KEY_BETA", BETA)):
        monkeypatch.setattr(ppl, name, value)
    data, texts = _data(tmp_path, (1200, 1500, 2000))
    settings = ppl.PplSettings(
        lengths=lengths, data=str(data), docs=3, key_tokens=True, dtype="fp32", batch_size=2, **more
    )
    run = run_benchmark(ppl.PplBenchmark(settings), resolve_checkpoints([str(TINY)]), tmp_path / "out")
    values = {row.length: row.value for row in run.result_rows() if row.metric == "longppl"}
    details = {d["length"]: d for d in run.summaries[0]["lengths"].values()}
    return values, details, texts


def test_longppl_equals_the_reference_definition_on_the_tiny_model(tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    lengths = [CONTEXT, CONTEXT + 1, 200]  # none; one position (64); 8 windows and a last one cut to 8
    values, details, texts = _run(tmp_path, monkeypatch, lengths)
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    found = 0
    for length in lengths:
        per_document = []
        for ids in _tokens(TINY, texts, length):
            keys, loss = _reference_key_tokens(model, ids, CONTEXT, STRIDE, ALPHA, BETA)
            per_document.append([loss[k - 1] for k in keys])
        expected = _reference_longppl(per_document)
        assert details[length]["key_tokens"] == sum(map(len, per_document))
        assert (values[length] is None) == (expected is None)
        if expected is not None:
            assert values[length] == pytest.approx(expected, rel=1e-4)
        found += sum(map(len, per_document))
    assert details[CONTEXT]["key_tokens"] == 0 and values[CONTEXT] is None  # L <= the short context: none
    assert found >= 20  # the comparison is not vacuous


def test_under_anchor_the_key_tokens_are_the_standard_readings_and_the_anchor_loss_is_averaged(tmp_path, monkeypatch):
    """--encoding anchor: the evaluator (the checkpoint reading the document in standard) finds the
    key tokens; LongPPL averages the anchor encoding's loss (one plain forward per piece) over them."""
    import torch
    from transformers import AutoModelForCausalLM

    values, details, texts = _run(tmp_path, monkeypatch, [200], encoding="anchor", doc_tokens=40)
    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    eos = int(model.config.eos_token_id)
    per_document = []
    for ids in _tokens(TINY, texts, 200):
        keys, _ = _reference_key_tokens(model, ids, CONTEXT, STRIDE, ALPHA, BETA)
        anchor = _anchor_reference(TINY, ids, 40, eos)  # anchor[p - 1]: position p's log-probability
        per_document.append([-anchor[k - 1] for k in keys])
    assert details[200]["key_tokens"] == sum(map(len, per_document)) > 0
    assert values[200] == pytest.approx(_reference_longppl(per_document), rel=1e-4)


def test_short_contexts_are_the_references_windows():
    """A scorer whose log-probability at a piece's position j is -j (the tokens it sees): token p
    (p >= context) is seen from start = stride * floor((p - context) / stride), the reference's
    window holding it; none below the context or at L <= context."""

    def score(pieces):
        return [[-float(j) for j in range(1, len(piece))] for piece in pieces]

    for length in (64, 65, 100, 150):
        short = ppl.short_logprobs(score, [list(range(length))], CONTEXT, STRIDE)[0]
        assert short == [-float(p - STRIDE * ((p - CONTEXT) // STRIDE)) for p in range(CONTEXT, length)]
        mask = ppl.key_token_mask([0.0] * (length - 1), [-2.5] * len(short))  # LSD 2.5 > 2, LCL 0 > -2
        assert [p for p, key in enumerate(mask, start=1) if key] == list(range(CONTEXT, length))
