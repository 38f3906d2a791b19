"""The plugin's kernel work, without vLLM: anchor-mode prefill over a paged cache equals the dense reference.

Reference: evalkit.attention.document_mask (the one definition of the rule) applied with SDPA
to contiguous keys and values. These run in every environment (no vLLM needed).
"""

import pytest
import torch
import torch.nn.functional as F

from evalkit.attention import document_mask
from evalkit.vllm_plugin.kernels import (
    IMPLEMENTATIONS,
    anchor_attention,
    anchor_block_mask,
    anchor_document_ids,
    gather_paged,
)

DOCUMENTS = [200, 57, 300, 1, 90, 128, 127]  # around and across FlexAttention's 128-token tiles


def reference(query_QHD, key_LHD, value_LHD, doc_ids_L, scale):
    """SDPA with the dense reference mask, queries being the last Q positions."""
    mask = document_mask(doc_ids_L, key_LHD.shape[0], query_QHD.shape[0])
    q, k, v = (t.transpose(0, 1)[None] for t in (query_QHD, key_LHD, value_LHD))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)[0].transpose(0, 1)


def random_paged_cache(length: int, heads: int, dim: int, block_size: int, seed: int = 0):
    """K/V [L, H, D] and the same tokens scattered over a paged cache in shuffled blocks."""
    generator = torch.Generator().manual_seed(seed)
    key, value = (torch.randn(length, heads, dim, generator=generator) for _ in range(2))
    num_used = -(-length // block_size)
    block_table = torch.randperm(num_used + 5, generator=generator)[:num_used]  # spare blocks stay zero
    caches = [torch.zeros(num_used + 5, block_size, heads, dim) for _ in range(2)]
    for cache, tokens in zip(caches, (key, value)):
        for position in range(length):
            cache[block_table[position // block_size], position % block_size] = tokens[position]
    return key, value, caches[0], caches[1], block_table


def test_document_ids_follow_the_segments():
    assert anchor_document_ids(1, [2, 3]).tolist() == [0, 1, 1, 2, 2, 2]
    assert anchor_document_ids(2, [1]).tolist() == [0, 0, 1]
    # A layout without an anchor or with an empty document is refused where it enters, as
    # PackedSegments (test_packing.py's test_malformed_layouts_are_refused), before any kernel.


def test_gather_reads_a_request_back_from_shuffled_blocks():
    key, _, key_cache, _, block_table = random_paged_cache(300, 2, 8, block_size=32)
    assert torch.equal(gather_paged(key_cache, block_table, 300), key)
    assert torch.equal(gather_paged(key_cache, block_table, 70), key[:70])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("num_queries", [None, 1, 100, 300, 129])
def test_anchor_prefill_over_a_paged_cache_equals_the_reference(impl, num_queries):
    doc_ids = anchor_document_ids(1, DOCUMENTS)
    length = doc_ids.numel()
    num_queries = num_queries or length  # None: a whole prefill; else the last chunk of a chunked one
    key, value, key_cache, value_cache, block_table = random_paged_cache(length, 2, 32, block_size=16)
    query = torch.randn(num_queries, 4, 32, generator=torch.Generator().manual_seed(1))
    key_gathered, value_gathered = (
        gather_paged(key_cache, block_table, length),
        gather_paged(value_cache, block_table, length),
    )
    out = anchor_attention(query, key_gathered, value_gathered, doc_ids, scale=0.2, impl=impl)
    torch.testing.assert_close(out, reference(query, key, value, doc_ids, 0.2), atol=2e-6, rtol=1e-5)


def test_anchor_attention_differs_from_causal_attention():
    doc_ids = anchor_document_ids(1, [40, 40])
    query, key, value = (torch.randn(81, 2, 16, generator=torch.Generator().manual_seed(s)) for s in range(3))
    out = anchor_attention(query, key, value, doc_ids, scale=0.25, impl="blocked")
    causal = reference(query, key, value, None, 0.25)
    assert torch.allclose(out[:41], causal[:41], atol=1e-6)  # the anchor and document 1 see the same keys
    assert (out[41:] - causal[41:]).abs().max() > 1e-2  # document 2 no longer sees document 1


def _block_level(mask_QL: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(any entry allowed, every real entry allowed) per block pair of a dense mask."""
    q_len, k_len = mask_QL.shape
    nq, nk = -(-q_len // block), -(-k_len // block)
    padded = torch.zeros(nq * block, nk * block, dtype=torch.bool)
    real = torch.zeros_like(padded)
    padded[:q_len, :k_len], real[:q_len, :k_len] = mask_QL, True
    any_allowed = padded.view(nq, block, nk, block).any(3).any(1)
    all_allowed = (padded | ~real).view(nq, block, nk, block).all(3).all(1)
    return any_allowed, all_allowed


def _listed(counts, indices, num_key_blocks: int) -> torch.Tensor:
    dense = torch.zeros(counts.shape[-1], num_key_blocks, dtype=torch.bool)
    for row in range(counts.shape[-1]):
        dense[row, indices[0, 0, row, : counts[0, 0, row]].long()] = True
    return dense


@pytest.mark.parametrize("num_queries", [None, 1, 100, 300, 903])
def test_block_mask_keeps_every_allowed_block_and_marks_full_only_full_ones(num_queries):
    """Exact at block level, so the compiled CUDA kernel (which trusts full blocks) is right too."""
    doc_ids = anchor_document_ids(1, DOCUMENTS)
    length = doc_ids.numel()
    num_queries = num_queries or length
    block_mask = anchor_block_mask(doc_ids, num_queries, block_size=64)
    any_allowed, all_allowed = _block_level(document_mask(doc_ids, length, num_queries), 64)
    partial = _listed(block_mask.kv_num_blocks, block_mask.kv_indices, any_allowed.shape[1])
    full = _listed(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, any_allowed.shape[1])
    assert bool((partial | full)[any_allowed].all())
    assert bool(all_allowed[full].all())
    assert not bool((partial & full).any())
    if num_queries == length:  # aligned tiles: the full-block fast path is really used
        assert int(full.sum()) > 0


def test_block_mask_skips_cross_document_blocks():
    """Work falls with the documents: with 8 documents of 512 tokens, sum(d^2)/S^2 is 1/8; tiles that
    straddle a boundary and the anchor's column keep it near a quarter of the causal tiles at 128."""
    doc_ids = anchor_document_ids(1, [512] * 8)
    block_mask = anchor_block_mask(doc_ids, doc_ids.numel())
    kept = int(block_mask.kv_num_blocks.sum() + block_mask.full_kv_num_blocks.sum())
    num_blocks = -(-doc_ids.numel() // 128)
    causal_blocks = num_blocks * (num_blocks + 1) // 2
    assert kept < 0.3 * causal_blocks


def test_documents_out_of_order_are_refused():
    with pytest.raises(ValueError, match="contiguous"):
        anchor_block_mask(torch.tensor([0, 1, 2, 1]), 2)
