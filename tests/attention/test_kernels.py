"""Every attention implementation against textbook float64 attention with the reference mask."""

import pytest
import torch

from evalkit.attention import (
    Paradigm,
    available_implementations,
    document_attention,
    document_mask,
    kernels,
    varlen_layout,
)
from tests.attention.varlen import varlen_reference
from tests.helpers import naive_attention, random_pack

CPU_IMPLS = ["dense", "blocked", "flash_emulated"]
ON_CUDA = torch.cuda.is_available()


def run_impl(name, q, k, v, doc_ids, scale=None):
    if name == "flash_emulated":  # flash's layout code with the kernel swapped for its emulation
        return kernels.flash_attention(q, k, v, doc_ids, scale=scale, varlen_func=varlen_reference)
    return document_attention(q, k, v, doc_ids, scale=scale, impl=name)


def batch_of_packs(paradigm, seq_len, seed, batch=2):
    packs = [random_pack(paradigm, seq_len, seed * 10 + b) for b in range(batch)]
    doc_ids = None if not paradigm.masks_documents else torch.stack([p.doc_ids for p in packs])
    return packs, doc_ids


def qkv(batch, hq, hkv, sq, sk, dim=16, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    make = lambda h, s: torch.randn(batch, h, s, dim, generator=g).to(device).requires_grad_()  # noqa: E731
    return make(hq, sq), make(hkv, sk), make(hkv, sk)


def reference_mask_batch(doc_ids, batch, sk, sq):
    mask = document_mask(doc_ids, sk, sq)
    return mask if mask.dim() == 3 else mask.expand(batch, sq, sk)


@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("paradigm", list(Paradigm))
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
def test_forward_and_gradients_match_reference(impl, paradigm, heads):
    seq_len = 96
    for seed in range(3):
        _, doc_ids = batch_of_packs(paradigm, seq_len, seed)
        q, k, v = qkv(2, *heads, seq_len, seq_len, seed=seed)
        out = run_impl(impl, q, k, v, doc_ids)
        ref = naive_attention(q, k, v, reference_mask_batch(doc_ids, 2, seq_len, seq_len))
        torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)

        grad_out = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out.double())
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", CPU_IMPLS + ["flex"])
@pytest.mark.parametrize("paradigm", [Paradigm.FULL, Paradigm.INTRA_DOC, Paradigm.ANCHOR, Paradigm.ANCHOR_INTERLEAVED])
def test_decoding_with_fewer_queries_than_keys(impl, paradigm):
    """The last Sq tokens query all Sk keys, as with a KV cache: bottom-right causality."""
    seq_len, num_q = 80, 7
    _, doc_ids = batch_of_packs(paradigm, seq_len, seed=5)
    q, k, v = qkv(2, 4, 2, num_q, seq_len, seed=3)
    with torch.no_grad():
        out = run_impl(impl, q, k, v, doc_ids)
        ref = naive_attention(q, k, v, reference_mask_batch(doc_ids, 2, seq_len, num_q))
    torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("paradigm", list(Paradigm))
def test_flex_forward_matches_reference_on_cpu(paradigm):
    """FlexAttention's forward runs on CPU (its backward needs CUDA: see the GPU check)."""
    seq_len = 128
    _, doc_ids = batch_of_packs(paradigm, seq_len, seed=1)
    q, k, v = qkv(2, 4, 2, seq_len, seq_len, seed=1)
    with torch.no_grad():
        out = document_attention(q, k, v, doc_ids, impl="flex")
        ref = naive_attention(q, k, v, reference_mask_batch(doc_ids, 2, seq_len, seq_len))
    torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not ON_CUDA, reason="FlexAttention backward and flash-attn need CUDA")
@pytest.mark.parametrize("impl", ["flex", "flash"])
@pytest.mark.parametrize("paradigm", list(Paradigm))
def test_cuda_kernels_forward_and_backward(impl, paradigm):
    if impl not in available_implementations("cuda"):
        pytest.skip(f"{impl} is not installed")
    seq_len = 512
    _, doc_ids = batch_of_packs(paradigm, seq_len, seed=2)
    q, k, v = qkv(2, 8, 2, seq_len, seq_len, dim=64, seed=2, device="cuda")
    out = document_attention(q, k, v, None if doc_ids is None else doc_ids.cuda(), impl=impl)
    ref = naive_attention(q, k, v, reference_mask_batch(doc_ids, 2, seq_len, seq_len).cuda())
    torch.testing.assert_close(out, ref.float(), atol=2e-5, rtol=2e-5)
    grad_out = torch.randn_like(out)
    for got, want in zip(
        torch.autograd.grad(out, (q, k, v), grad_out), torch.autograd.grad(ref, (q, k, v), grad_out.double())
    ):
        torch.testing.assert_close(got, want.float(), atol=2e-5, rtol=2e-5)


def test_varlen_layout_prepends_anchor_to_every_document():
    doc_ids = torch.tensor([[0, 1, 1, 2, 2, 2, 1]])  # anchor, doc 1 (interleaved), doc 2
    layout = varlen_layout(doc_ids, batch=1, kv_len=7, q_len=7)
    seqs_q = [layout.q_index[a:b].tolist() for a, b in zip(layout.cu_seqlens_q[:-1], layout.cu_seqlens_q[1:])]
    seqs_k = [layout.k_index[a:b].tolist() for a, b in zip(layout.cu_seqlens_k[:-1], layout.cu_seqlens_k[1:])]
    assert seqs_q == [[0], [1, 2, 6], [3, 4, 5]]
    assert seqs_k == [[0], [0, 1, 2, 6], [0, 3, 4, 5]]
    assert layout.max_seqlen_q == 3 and layout.max_seqlen_k == 4
    assert layout.cu_seqlens_q.dtype == torch.int32


def test_varlen_layout_flattens_the_batch():
    doc_ids = torch.tensor([[1, 1, 2], [1, 2, 2]])
    layout = varlen_layout(doc_ids, batch=2, kv_len=3, q_len=3)
    assert layout.q_index.tolist() == [0, 1, 2, 3, 4, 5]
    assert layout.cu_seqlens_q.tolist() == [0, 2, 3, 4, 6]
    assert layout.cu_seqlens_k.tolist() == [0, 2, 3, 4, 6]


def test_varlen_reference_aligns_causal_bottom_right():
    # One query over three keys: the query is the last key, so it sees all three.
    q = torch.randn(1, 1, 4)
    k = torch.randn(3, 1, 4)
    v = torch.randn(3, 1, 4)
    out = varlen_reference(q, k, v, torch.tensor([0, 1]), torch.tensor([0, 3]), causal=True)
    weights = (q[0, 0] @ k[:, 0].T * 0.5).softmax(-1)
    torch.testing.assert_close(out[0, 0], weights @ v[:, 0])


def test_anchor_must_lead_the_sequence():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="anchor tokens"):
        document_attention(q, q, q, torch.tensor([[1, 0, 1, 1]]), impl="blocked")


def test_bad_shapes_and_names_are_errors():
    q = torch.randn(1, 3, 4, 8)
    k = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="multiple"):
        document_attention(q, k, k)
    with pytest.raises(ValueError, match="unknown attention implementation"):
        document_attention(q, q, q, impl="magic")
    with pytest.raises(ValueError, match="doc_ids covers"):
        document_attention(q, q, q, torch.zeros(1, 5, dtype=torch.long))


def test_flash_without_flash_attn_says_how_to_install():
    pytest.importorskip("torch")
    try:
        import flash_attn  # noqa: F401

        pytest.skip("flash-attn is installed")
    except ImportError:
        pass
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(RuntimeError, match=r"evalkit\[gpu\]"):
        document_attention(q, q, q, None, impl="flash")
