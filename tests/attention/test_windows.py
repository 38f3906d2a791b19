"""Sliding windows composed with the paradigms' document rule, in every implementation, against
float64 attention under a mask written here from the definition (one loop over query and key):

    j <= i  and  (doc[i] == doc[j]  or  doc[j] is the anchor)  and  (i - j < W  or  (sink and doc[j] is the anchor))
"""

import pytest
import torch

from evalkit.attention import ANCHOR_DOC_ID, Paradigm, document_attention, kernels
from tests.attention.test_kernels import batch_of_packs, qkv
from tests.attention.varlen import varlen_reference
from tests.helpers import naive_attention

ON_CUDA = torch.cuda.is_available()
ANCHOR_FREE = [p for p in Paradigm if not p.has_anchor and not p.interleaves]


def definition_mask(doc_ids, batch: int, sk: int, sq: int, window: int, anchor: str) -> torch.Tensor:
    mask = torch.zeros(batch, sq, sk, dtype=torch.bool)
    for b in range(batch):
        for row in range(sq):
            i = sk - sq + row  # queries are the last keys
            for j in range(i + 1):
                same = doc_ids is None or doc_ids[b, i] == doc_ids[b, j] or doc_ids[b, j] == ANCHOR_DOC_ID
                is_anchor = doc_ids is not None and doc_ids[b, j] == ANCHOR_DOC_ID
                mask[b, row, j] = bool(same) and (i - j < window or (anchor == "sink" and bool(is_anchor)))
    return mask


def run(name, q, k, v, doc_ids, window, anchor):
    if name == "flash_emulated":  # flash's layout code with the kernel swapped for its emulation
        return kernels.flash_attention(q, k, v, doc_ids, window=window, anchor=anchor, varlen_func=varlen_reference)
    return document_attention(q, k, v, doc_ids, impl=name, window=window, anchor=anchor)


def check_forward_and_backward(name, paradigm, window, anchor, seq_len=64, seed=0):
    _, doc_ids = batch_of_packs(paradigm, seq_len, seed=seed)
    q, k, v = qkv(2, 4, 2, seq_len, seq_len, seed=seed)
    out = run(name, q, k, v, doc_ids, window, anchor)
    ref = naive_attention(q, k, v, definition_mask(doc_ids, 2, seq_len, seq_len, window, anchor))
    torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    want = torch.autograd.grad(ref, (q, k, v), grad_out.double())
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["dense", "blocked"])
@pytest.mark.parametrize("paradigm", list(Paradigm))
@pytest.mark.parametrize("anchor", ["window", "sink"])
def test_windowed_forward_and_gradients_match_the_definition(impl, paradigm, anchor):
    check_forward_and_backward(impl, paradigm, window=7, anchor=anchor)


@pytest.mark.parametrize("paradigm", ANCHOR_FREE)
@pytest.mark.parametrize("window", [1, 7, 30])
def test_flash_layout_with_a_window_matches_the_definition(paradigm, window):
    check_forward_and_backward("flash_emulated", paradigm, window=window, anchor="window", seed=3)


@pytest.mark.parametrize("impl", ["dense", "blocked"])
@pytest.mark.parametrize("paradigm", [Paradigm.FULL, Paradigm.ANCHOR, Paradigm.INTRA_DOC_INTERLEAVED])
@pytest.mark.parametrize("anchor", ["window", "sink"])
def test_windowed_decoding_with_fewer_queries_than_keys(impl, paradigm, anchor):
    seq_len, queries = 64, 3
    _, doc_ids = batch_of_packs(paradigm, seq_len, seed=5)
    q, k, v = qkv(2, 4, 2, queries, seq_len, seed=5)
    with torch.no_grad():
        out = run(impl, q, k, v, doc_ids, 9, anchor)
        ref = naive_attention(q, k, v, definition_mask(doc_ids, 2, seq_len, queries, 9, anchor))
    torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("paradigm", [Paradigm.FULL, Paradigm.INTRA_DOC, Paradigm.ANCHOR])
@pytest.mark.parametrize("anchor", ["window", "sink"])
def test_flex_forward_with_a_window_matches_the_definition_on_cpu(paradigm, anchor):
    seq_len = 128
    _, doc_ids = batch_of_packs(paradigm, seq_len, seed=1)
    q, k, v = qkv(2, 4, 2, seq_len, seq_len, seed=1)
    with torch.no_grad():
        out = document_attention(q, k, v, doc_ids, impl="flex", window=11, anchor=anchor)
        ref = naive_attention(q, k, v, definition_mask(doc_ids, 2, seq_len, seq_len, 11, anchor))
    torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)


def test_the_two_anchor_readings_differ_where_the_anchor_is_out_of_the_window():
    _, doc_ids = batch_of_packs(Paradigm.ANCHOR, 64, seed=0)
    q, k, v = qkv(2, 4, 2, 64, 64, seed=0)
    with torch.no_grad():
        inside = document_attention(q, k, v, doc_ids, impl="blocked", window=7, anchor="window")
        sink = document_attention(q, k, v, doc_ids, impl="blocked", window=7, anchor="sink")
    assert torch.allclose(inside[:, :, :7], sink[:, :, :7])  # the anchor is in every window there
    assert not torch.allclose(inside[:, :, 7:], sink[:, :, 7:])


def test_flash_refuses_a_window_with_the_anchor():
    _, doc_ids = batch_of_packs(Paradigm.ANCHOR, 64, seed=0)
    q, k, v = qkv(2, 4, 2, 64, 64, seed=0)
    with pytest.raises(ValueError, match="cannot combine a sliding window with the anchor"):
        kernels.flash_attention(q, k, v, doc_ids, window=7, varlen_func=varlen_reference)


def test_bad_windows_are_errors():
    q = torch.randn(1, 1, 4, 8)
    for window, anchor, message in [(0, "window", "positive"), (4, "always", "window, sink")]:
        with pytest.raises(ValueError, match=message):
            document_attention(q, q, q, None, impl="dense", window=window, anchor=anchor)


@pytest.mark.skipif(not ON_CUDA, reason="FlexAttention backward and flash-attn need CUDA")
@pytest.mark.parametrize("paradigm", [Paradigm.FULL, Paradigm.INTRA_DOC, Paradigm.ANCHOR])
def test_cuda_flex_with_a_window_forward_and_backward(paradigm):
    seq_len = 256
    _, doc_ids = batch_of_packs(paradigm, seq_len, seed=2)
    q, k, v = qkv(2, 8, 2, seq_len, seq_len, dim=64, seed=2, device="cuda")
    out = document_attention(q, k, v, None if doc_ids is None else doc_ids.cuda(), impl="flex", window=37)
    ref = naive_attention(q, k, v, definition_mask(doc_ids, 2, seq_len, seq_len, 37, "window").cuda())
    torch.testing.assert_close(out, ref.float(), atol=2e-5, rtol=2e-5)
    grad_out = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, (q, k, v), grad_out), torch.autograd.grad(ref, (q, k, v), grad_out.double())
    ):
        torch.testing.assert_close(got, want.float(), atol=2e-5, rtol=2e-5)
