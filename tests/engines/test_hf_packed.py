"""Packed anchor requests: equal to a dense-mask forward built by hand, and unlike plain causal attention.

Reference: one forward over [anchor d1 EOS d2 EOS ... question] with the mask written out:
document rows follow evalkit's document rule (own document plus the anchor), question rows and
generated rows see everything before them.
"""

import pytest
import torch

from evalkit.attention import document_mask
from evalkit.attention.hf import GROUPED_SDPA
from evalkit.engines import PackedRequest, get_engine
from evalkit.engines import tokens as tok
from evalkit.errors import UserError
from tests.helpers import decode, full_logits, greedy_without_cache

REQUESTS = [
    PackedRequest(["The grass is green.", "The sky is blue. The sun is yellow."], " What color is the sky?"),
    PackedRequest(["Here we go.", "There and back.", "One of the special magic numbers is: 7."], " The number is"),
    PackedRequest(["A"], " B"),
    PackedRequest([[300, 301, 302, 303], "Some text."], [304, 305]),
]


def reference_mask(layout: tok.PackedLayout, length: int) -> torch.Tensor:
    """Bool [length, length]: the document rule for the documents, all earlier tokens for everything after."""
    n = layout.num_document_tokens
    mask = torch.tril(torch.ones(length, length, dtype=torch.bool))
    mask[:n, :n] = document_mask(torch.tensor(layout.doc_ids), n)
    return mask


def engine_for(checkpoint, **settings):
    path, _ = checkpoint
    return get_engine("hf", path, dtype="fp32", device="cpu", **settings)


@pytest.mark.parametrize("packed_attention", ["evalkit", "evalkit_dense"])
def test_packed_logits_equal_the_dense_reference(checkpoint, tokenizer, packed_attention):
    _, model = checkpoint
    engine = engine_for(checkpoint, batch_size=3, packed_attention=packed_attention)  # padded rows
    logits = engine.logits_packed(REQUESTS)
    for request, row in zip(REQUESTS, logits):
        layout = tok.packed_layout(tokenizer, request.documents, request.question)
        n = len(layout.input_ids)
        expected = full_logits(model, layout.input_ids, reference_mask(layout, n))[-1].log_softmax(-1)
        torch.testing.assert_close(row, expected, atol=1e-4, rtol=1e-4)


def test_packed_logits_differ_from_plain_causal_attention(checkpoint, tokenizer):
    _, model = checkpoint
    logits = engine_for(checkpoint).logits_packed(REQUESTS[:2])
    for request, row in zip(REQUESTS, logits):
        layout = tok.packed_layout(tokenizer, request.documents, request.question)
        causal = full_logits(model, layout.input_ids)[-1].log_softmax(-1)
        assert (row - causal).abs().max() > 1e-2


def test_generate_packed_equals_greedy_loop_with_the_dense_mask(checkpoint, tokenizer):
    _, model = checkpoint
    outputs = engine_for(checkpoint, batch_size=2).generate_packed(REQUESTS, max_new_tokens=8)
    for request, output in zip(REQUESTS, outputs):
        layout = tok.packed_layout(tokenizer, request.documents, request.question)
        expected = greedy_without_cache(
            model, layout.input_ids, 8, {tokenizer.eos_token_id}, mask_for=lambda n: reference_mask(layout, n)
        )
        assert output == decode(tokenizer, expected)


def test_batched_packed_generation_equals_one_at_a_time(checkpoint):
    one = engine_for(checkpoint, batch_size=1).generate_packed(REQUESTS, max_new_tokens=10)
    batched = engine_for(checkpoint, batch_size=4).generate_packed(REQUESTS, max_new_tokens=10)
    assert one == batched


def test_packed_generation_leaves_plain_attention_in_place(checkpoint):
    engine = engine_for(checkpoint)
    before = engine.generate(["The grass is green."], max_new_tokens=6)
    engine.generate_packed(REQUESTS[:1], max_new_tokens=2)
    assert engine.model.config._attn_implementation == GROUPED_SDPA  # the engine's plain attention (SDPA)
    assert engine.generate(["The grass is green."], max_new_tokens=6) == before


def test_over_long_packed_request_is_an_error_naming_the_lengths(checkpoint):
    engine = engine_for(checkpoint, max_length=16)
    request = PackedRequest([[300] * 5, [301] * 5], [302, 303])  # 1 + 6 + 6 document tokens, 2 question tokens
    with pytest.raises(
        UserError,
        match=r"packed request of 15 tokens \(13 for the anchor and 2 documents, 2 for the "
        r"question\) \+ 4 new tokens = 19 exceeds the model window of 16",
    ):
        engine.generate_packed([request], max_new_tokens=4)
