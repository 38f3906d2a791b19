"""Anchor-mode prefill attention over a paged KV cache: the vLLM backend's kernel work, without
vLLM (so a GPU machine without vLLM can check it: tests/gpu/test_vllm_kernels.py).

Shapes: Q queries of one request in this step (its last Q positions), L keys (its context so
far), Hq/Hkv query/key-value heads, D head dim, nQb/nKb a BlockMask's query/key blocks. A paged
cache is [NB blocks, BS tokens, Hkv, D] (views are fine) and a request's block-table row lists
the blocks of its positions 0, BS, 2*BS, ... in order, as vLLM's block tables do.

The rule is evalkit.attention's (masks.py); only document queries come here (anchor_backend).

Implementations: flex (a BlockMask built at block level from document boundaries, no Q x L mask
anywhere; compiled on CUDA, eager elsewhere), blocked (one SDPA call per document: the CPU path)
and dense (SDPA with the materialised reference mask: the reference, O(Q x L) memory).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch

from evalkit.attention import ANCHOR_DOC_ID, PAD_DOC_ID, document_attention
from evalkit.attention.kernels import FLEX_DECODING_QUERIES, default_implementation, raise_recompile_limit, run_flex

IMPLEMENTATIONS = ("flex", "blocked", "dense")
FLEX_BLOCK_SIZE = 128  # FlexAttention's default tile: the BlockMask granularity


def anchor_document_ids(anchor_length: int, document_lengths: Sequence[int]) -> torch.Tensor:
    """Document ids [anchor_length + sum(document_lengths)]: ANCHOR_DOC_ID for the anchor, 1.. per
    document (lengths as PackedSegments checks them)."""
    lengths = torch.tensor([anchor_length, *document_lengths])
    return torch.repeat_interleave(torch.arange(len(lengths)), lengths) + ANCHOR_DOC_ID


def gather_paged(cache_NBHD: torch.Tensor, block_table_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one request from a paged cache: [L, Hkv, D] (a copy)."""
    positions = torch.arange(length, device=cache_NBHD.device)
    block_size = cache_NBHD.shape[1]
    return cache_NBHD[block_table_row.to(cache_NBHD.device)[positions // block_size].long(), positions % block_size]


def _block_ranges(doc_ids_L: torch.Tensor, start: int, stop: int, block_size: int):
    """Per block of positions [start, stop): first and last position, smallest and largest doc id."""
    first = torch.arange(start, stop, block_size, device=doc_ids_L.device)
    last = torch.clamp(first + block_size - 1, max=stop - 1)
    return first, last, doc_ids_L[first], doc_ids_L[last]  # doc ids are non-decreasing in position


def _kv_block_lists(blocks_QK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BlockMask's (kv_num_blocks [1,1,nQb], kv_indices [1,1,nQb,nKb]) of a block-level bool matrix."""
    counts = blocks_QK.sum(dim=1, dtype=torch.int32)
    # A stable sort puts each row's chosen key blocks first, in increasing order.
    indices = torch.argsort(blocks_QK.to(torch.int8), dim=1, descending=True, stable=True).to(torch.int32)
    return counts[None, None], indices[None, None]


def anchor_mask_mod(doc_ids_L: torch.Tensor, num_queries: int) -> Callable:
    """The document rule as FlexAttention's mask_mod for the last `num_queries` of L positions."""
    length = doc_ids_L.numel()
    offset = length - num_queries
    # Padded tiles evaluate indices past the ends: a PAD tail keeps every lookup in range, and
    # PAD keys match no document (nor the anchor).
    doc = torch.cat([doc_ids_L, doc_ids_L.new_full((FLEX_BLOCK_SIZE + 1,), PAD_DOC_ID)])

    def mask_mod(b, h, q_idx, kv_idx):
        q_pos = q_idx + offset
        return (kv_idx <= q_pos) & ((doc[kv_idx] == doc[q_pos]) | (doc[kv_idx] == ANCHOR_DOC_ID))

    return mask_mod


def anchor_block_mask(
    doc_ids_L: torch.Tensor, num_queries: int, block_size: int = FLEX_BLOCK_SIZE, *, check_order: bool = True
):
    """BlockMask for the last `num_queries` of L positions under the document rule, built per block.

    Work and memory are O(nQb x nKb): a block pair is skipped when causality or the documents
    rule out every entry, full when they allow every entry (mask_mod not evaluated), partial (the
    safe side: mask_mod decides within it) otherwise. The block-level reasoning needs the anchor
    first and documents contiguous, in order: checking that reads values back (a host sync on
    CUDA), so a caller whose ids are in order by construction passes check_order=False.
    """
    from torch.nn.attention.flex_attention import BlockMask

    if check_order and doc_ids_L.numel():
        if bool((doc_ids_L.diff() < 0).any()) or int(doc_ids_L.min()) < ANCHOR_DOC_ID:
            raise ValueError("anchor-mode prefill needs the anchor first and each document contiguous, in order")
    length = doc_ids_L.numel()
    offset = length - num_queries
    q_first, q_last, q_doc_min, q_doc_max = _block_ranges(doc_ids_L, offset, length, block_size)
    k_first, k_last, k_doc_min, k_doc_max = _block_ranges(doc_ids_L, 0, length, block_size)
    causal_any = k_first[None, :] <= q_last[:, None]
    causal_all = k_last[None, :] <= q_first[:, None]
    has_anchor = (k_doc_min == ANCHOR_DOC_ID)[None, :]
    docs_overlap = (k_doc_min[None, :] <= q_doc_max[:, None]) & (q_doc_min[:, None] <= k_doc_max[None, :])
    one_doc = (k_doc_min[None, :] == k_doc_max[None, :]) & (q_doc_min[:, None] == q_doc_max[:, None])
    same_single_doc = one_doc & (k_doc_min[None, :] == q_doc_min[:, None])
    all_anchor = (k_doc_max == ANCHOR_DOC_ID)[None, :]
    any_allowed = causal_any & (has_anchor | docs_overlap)
    all_allowed = causal_all & (all_anchor | same_single_doc)
    partial_count, partial_index = _kv_block_lists(any_allowed & ~all_allowed)
    full_count, full_index = _kv_block_lists(all_allowed)
    return BlockMask.from_kv_blocks(
        partial_count,
        partial_index,
        full_count,
        full_index,
        BLOCK_SIZE=block_size,
        mask_mod=anchor_mask_mod(doc_ids_L, num_queries),
        seq_lengths=(num_queries, length),
    )


def shape_class(num_queries: int, length: int, block: int = FLEX_BLOCK_SIZE) -> tuple[bool, ...]:
    """What the compiled serving function's guards tell apart about a prefill of Q queries over L
    keys: Dynamo specialises sizes of 1 (a single query, a single query block, a single key block
    of the BlockMask) and gives equal sizes one symbol (a whole prefill, Q == L; as many query as
    key blocks); the CUDA lowering adds Q < FLEX_DECODING_QUERIES. Prefills of one class replay
    one graph."""
    query_blocks, key_blocks = -(-num_queries // block), -(-length // block)
    return (
        num_queries == 1,
        num_queries < FLEX_DECODING_QUERIES,
        query_blocks == 1,
        key_blocks == 1,
        num_queries == length,
        query_blocks == key_blocks,
    )


def _candidate_sizes(block: int) -> list[int]:
    """Query and key counts to pick class members from: 1, and values on and beside each block
    boundary of up to eight blocks (every class has members among them)."""
    sizes = {1, 2, 3}
    for blocks in range(1, 9):
        sizes.update(blocks * block + offset for offset in (-37, -29, -1, 0, 1, 29, 37))
    return sorted(size for size in sizes if size >= 1)


def warm_up_shapes(other_sizes: Sequence[int] = (), block: int = FLEX_BLOCK_SIZE) -> tuple[tuple[int, int], ...]:
    """(queries, keys) of one prefill per shape class, the warm-up's.

    Dynamo gives equal sizes one symbol (duck sizing) and guards the graph on their equality, so a
    member is chosen whose sizes (Q, L, the BlockMask's query and key block counts, the padded
    document-id table's L + block + 1) equal neither each other, where the class does not say so,
    nor `other_sizes` (the layer's heads, key-value heads, head size): a graph compiled there
    covers the whole class. A class all of whose members coincide keeps its smallest member (a
    graph specialised to a coincidence every member shares, such as Q = 128 = head size)."""
    avoided = set(other_sizes)
    candidates = _candidate_sizes(block)
    # Fewest queries first (L >= 2: the anchor and a document token): torch 2.13's CUDA lowering
    # (kernel/flex/flex_decoding.py, create_flex_decoding_kernel) sizes its decoding kernel's query
    # tile from the compiling prefill, unguarded, as BLOCK_M = max(next_power_of_2(Q * G), 16) (G:
    # query heads per KV head, packed into the tile) and drops every config unless BLOCK_M divides
    # the BlockMask's 128-query block. Members below 128 queries have Q <= 3, valid while Q * G <=
    # 128; Q = 91 at 16 over 2 heads (Qwen2.5-3B) left no config (pytorch PR #185349).
    prefills = [(q, length) for q in candidates for length in candidates if length >= 2 and q <= length]
    chosen: dict[tuple[bool, ...], tuple[int, int]] = {}
    # A stable sort puts the members that coincide nowhere first, each group in that order.
    for num_queries, length in sorted(prefills, key=lambda qk: _coincides(qk[0], qk[1], block, avoided)):
        chosen.setdefault(shape_class(num_queries, length, block), (num_queries, length))
    # Largest first: where FlexAttention runs uncompiled (a CPU), torch still compiles its inner
    # wrapper with automatic dynamic shapes, whose first graph is static: spent on a large prefill,
    # the graphs after it are general.
    return tuple(sorted(chosen.values(), reverse=True))


def _coincides(num_queries: int, length: int, block: int, avoided: set[int]) -> bool:
    """Whether the prefill's dynamic sizes equal an avoided size, or each other beyond what its
    class states (Q == L, as many query as key blocks). Sizes of 1 are specialised, not symbols."""
    query_blocks, key_blocks = -(-num_queries // block), -(-length // block)
    named = {"Q": num_queries, "L": length, "QB": query_blocks, "KB": key_blocks, "padded": length + block + 1}
    symbols = {name: size for name, size in named.items() if size != 1}
    if avoided & set(symbols.values()):
        return True
    stated = ({"Q", "L"}, {"QB", "KB"})
    pairs = itertools.combinations(symbols, 2)
    return any(symbols[a] == symbols[b] and {a, b} not in stated for a, b in pairs)


# Dynamo's recompile limit for the serving function: a graph per shape class (at most 2^6 classes,
# 10 occur) and as many again to spare (past the limit it would run FlexAttention eagerly; vLLM's
# stance makes that an error).
SERVING_RECOMPILE_LIMIT = 2 * len(warm_up_shapes())
_warmed_up: set[tuple] = set()


def warm_up_anchor_flex(
    num_heads: int, num_kv_heads: int, head_size: int, scale: float, dtype: torch.dtype, device
) -> None:
    """Compile the serving FlexAttention function before vLLM serves (once per process and kind):
    under vLLM's "fail_on_recompile" stance a first compile at the first packed request raises.
    One prefill per shape class the compiled function specialises on (warm_up_shapes), with the
    layer's heads, scale and dtype, so that serving only replays graphs that exist."""
    device = torch.device(device)
    key = (num_heads, num_kv_heads, head_size, scale, dtype, str(device))
    if key in _warmed_up:
        return
    raise_recompile_limit(SERVING_RECOMPILE_LIMIT)
    with _as_vllm_serves():
        for num_queries, length in warm_up_shapes((num_heads, num_kv_heads, head_size)):
            documents = [n for n in (length // 3, length - 1 - length // 3) if n > 0]
            doc_ids = anchor_document_ids(1, documents).to(device)
            query = torch.zeros(num_queries, num_heads, head_size, dtype=dtype, device=device)
            key_value = torch.zeros(length, num_kv_heads, head_size, dtype=dtype, device=device)
            block_mask = anchor_block_mask(doc_ids, num_queries, check_order=False)  # as plan_document_queries does
            anchor_attention(query, key_value, key_value, doc_ids, scale=scale, impl="flex", block_mask=block_mask)
    _warmed_up.add(key)


@contextmanager
def _as_vllm_serves():
    """The global state Dynamo guards on, as it is while vLLM serves: inference mode, torch's
    default dtype and no torch-function mode. vLLM builds the model (and so the impl that warms
    up) under the model's default dtype, inside a `with torch.device(...)` (a torch-function mode)
    and with autograd on; graphs compiled in that state would not match at serving time."""
    from torch.overrides import _get_current_function_mode_stack, _pop_mode, _push_mode

    previous = torch.get_default_dtype()
    modes = _get_current_function_mode_stack()
    for _ in modes:
        _pop_mode()
    torch.set_default_dtype(torch.float32)
    try:
        with torch.inference_mode():
            yield
    finally:
        torch.set_default_dtype(previous)
        for mode in modes:
            _push_mode(mode)


def anchor_attention(
    query_QHD: torch.Tensor,
    key_LHD: torch.Tensor,
    value_LHD: torch.Tensor,
    doc_ids_L: torch.Tensor,
    *,
    scale: float,
    impl: str = "auto",
    block_mask=None,
) -> torch.Tensor:
    """Attention of the last Q of L positions under the document rule: [Q, Hq, D]. doc_ids_L: every
    key's document (anchor first, documents contiguous); block_mask (flex only): prebuilt with
    anchor_block_mask, reused across layers."""
    num_queries, length = query_QHD.shape[0], key_LHD.shape[0]
    if num_queries > length or doc_ids_L.numel() != length:
        raise ValueError(f"{num_queries} queries, {length} keys and {doc_ids_L.numel()} doc ids do not line up")
    name = default_implementation(query_QHD.device) if impl == "auto" else impl
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {impl!r}; choose auto or one of: {', '.join(IMPLEMENTATIONS)}")
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (query_QHD, key_LHD, value_LHD))  # [1, H, S, D]
    doc_ids_L = doc_ids_L.to(query_QHD.device)
    if name == "flex":
        block_mask = block_mask if block_mask is not None else anchor_block_mask(doc_ids_L, num_queries)
        out = run_flex(q, k, v, block_mask, scale=scale, mask_kind="anchor", dynamic=True)
    else:
        out = document_attention(q, k, v, doc_ids_L, scale=scale, impl=name)
    return out[0].transpose(0, 1)
