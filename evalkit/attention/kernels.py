"""Interchangeable implementations of document-masked attention (the rule in masks.py; what each
does and where flash serves windows: docs/attention.md).

All take q [B, Hq, Sq, D], k and v [B, Hkv, Sk, D] (grouped-query when Hkv < Hq), doc_ids
[B, Sk] or None, and return [B, Hq, Sq, D]; with Sq < Sk the queries are the last Sq keys
(decoding with a KV cache).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from evalkit.attention.masks import check_window, document_mask
from evalkit.attention.packing import ANCHOR_DOC_ID


@dataclass
class Segment:
    """One independent causal attention problem, aligned bottom-right: k_index (token positions in
    one batch row) is sorted and ends with the positions of q_index (shifted by Sk - Sq), so
    bottom-right causality is the document rule."""

    q_index: torch.Tensor  # long [Lq], query rows 0..Sq-1
    k_index: torch.Tensor  # long [Lk], key columns 0..Sk-1, Lk >= Lq
    num_prefix: int  # leading keys shared from the anchor (0 when none)


def document_segments(doc_row: torch.Tensor | None, kv_len: int, q_len: int) -> list[Segment]:
    """Split one row's attention into per-document causal problems (the anchor prepended to each)."""
    offset = kv_len - q_len
    if doc_row is None:
        return [Segment(torch.arange(q_len), torch.arange(kv_len), 0)]
    doc_row = doc_row.cpu()
    anchor = (doc_row == ANCHOR_DOC_ID).nonzero().flatten()
    if anchor.numel() and not torch.equal(anchor, torch.arange(anchor.numel())):
        raise ValueError("anchor tokens (doc id 0) must come first in the sequence")
    sorted_ids, order = torch.sort(doc_row, stable=True)
    _, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    segments = []
    for keys in torch.split(order, counts.tolist()):
        queries = keys[keys >= offset] - offset
        if queries.numel() == 0:
            continue  # a document entirely in the cache: no query of this step is in it
        prefix = anchor[:0] if bool(doc_row[keys[0]] == ANCHOR_DOC_ID) else anchor  # none for the anchor's own
        segments.append(Segment(queries, torch.cat([prefix, keys]), int(prefix.numel())))
    segments.sort(key=lambda seg: int(seg.k_index[seg.num_prefix]))  # order of appearance
    return segments


def _rows(doc_ids: torch.Tensor | None, batch: int) -> list[torch.Tensor | None]:
    if doc_ids is None:
        return [None] * batch
    if doc_ids.dim() == 1:
        doc_ids = doc_ids.unsqueeze(0).expand(batch, -1)
    if doc_ids.shape[0] != batch:
        raise ValueError(f"doc_ids has batch {doc_ids.shape[0]}, attention has batch {batch}")
    return list(doc_ids)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc_ids: torch.Tensor | None) -> None:
    if q.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"expected q [B,Hq,Sq,D], k/v [B,Hkv,Sk,D]; got {tuple(q.shape)}, {tuple(k.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} key/value heads")
    if q.shape[2] > k.shape[2]:
        raise ValueError(f"more queries ({q.shape[2]}) than keys ({k.shape[2]})")
    if doc_ids is not None and doc_ids.shape[-1] != k.shape[2]:
        raise ValueError(f"doc_ids covers {doc_ids.shape[-1]} tokens, the keys {k.shape[2]}")


def _effective_window(window: int | None, kv_len: int) -> int | None:
    """None when the window cannot cut anything at this length (no query is W keys from key 0), so
    that every implementation takes its unwindowed path there."""
    return window if window is not None and window < kv_len else None


def dense_attention(q, k, v, doc_ids=None, *, scale=None, window=None, anchor="window"):
    sq, sk = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if doc_ids is None and sq == sk and window is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    mask = document_mask(doc_ids, sk, sq, window=window, anchor=anchor)  # [Sq, Sk] or [B, Sq, Sk]
    if mask.dim() == 3:
        mask = mask.unsqueeze(1)  # [B, 1, Sq, Sk], broadcast over heads
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device), scale=scale, enable_gqa=gqa)


def _is_run(index: torch.Tensor) -> bool:
    """True when the sorted positions `index` are one contiguous run of the row."""
    return int(index[-1] - index[0]) + 1 == index.numel()


def _segment_sdpa(q, k, v, seg: Segment, q_pos, *, doc_row, scale, gqa: bool, window, anchor):
    """One segment's causal SDPA [1, H, Lq, D], its queries at sequence positions `q_pos`, within
    the window (masks.py's rule) where it cuts into the segment."""
    k_pos = seg.k_index
    windowed = window is not None and int(q_pos.max()) - int(k_pos.min()) >= window
    if not windowed and q.shape[2] == k.shape[2]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    distance = q_pos[:, None] - k_pos[None, :]
    mask = distance >= 0  # SDPA's is_causal aligns top-left; a KV cache needs bottom-right
    if windowed:
        seen = distance < window
        if anchor == "sink":
            seen = seen | (doc_row[k_pos] == ANCHOR_DOC_ID)[None, :]
        mask = mask & seen
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device), scale=scale, enable_gqa=gqa)


def _blocked_row_prefill(q_row, k_row, v_row, segments: list[Segment], sdpa: Callable):
    """Sq == Sk: one causal SDPA per document, anchor rows in front.

    Every key has its query here, so each document runs as [anchor rows, document rows] on
    SDPA's causal fast path and the duplicated anchor rows of the output are dropped. The
    data movement around the kernels is shaped by autograd: the backward of a slice or gather
    of a full-size tensor writes a full-size zero tensor, so full-size tensors are only ever
    split (backward: one concatenation) or gathered once.
    """
    length = q_row.shape[1]
    own = [seg.k_index[seg.num_prefix :] for seg in segments]
    # The documents tile the row in order (every paradigm but the interleaved): split, no gather.
    if all(_is_run(keys) for keys in own) and sum(keys.numel() for keys in own) == length:
        sizes = [keys.numel() for keys in own]
        pieces = [t.split(sizes, dim=1) for t in (q_row, k_row, v_row)]  # views, no copy
        anchors = [t[0] for t in pieces]  # where a document has a prefix, segment 0 is the anchor's own
        outputs = []
        for i, seg in enumerate(segments):
            q, k, v = (p[i] for p in pieces)
            if seg.num_prefix:
                q, k, v = (torch.cat([a, t], dim=1) for a, t in zip(anchors, (q, k, v)))
            # The rows here are [anchor, document]: their positions are seg.k_index, in order.
            out = sdpa(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), seg, seg.k_index)
            outputs.append(out[0, :, seg.num_prefix :])
        return torch.cat(outputs, dim=1)

    # Interleaved documents: gather once, with the anchor repeated in front of each document.
    device = q_row.device
    gather = torch.cat([seg.k_index for seg in segments]).to(device)
    lengths = [seg.k_index.numel() for seg in segments]
    q_seg, k_seg, v_seg = (t.index_select(1, gather).unsqueeze(0).split(lengths, dim=2) for t in (q_row, k_row, v_row))
    outputs = [sdpa(q, k, v, seg, seg.k_index) for q, k, v, seg in zip(q_seg, k_seg, v_seg, segments)]
    row_of_position = torch.empty(length, dtype=torch.long)  # each position's own (non-duplicate) row
    start = 0
    for seg, keys in zip(segments, own):
        row_of_position[keys] = torch.arange(start + seg.num_prefix, start + seg.k_index.numel())
        start += seg.k_index.numel()
    return torch.cat(outputs, dim=2)[0].index_select(1, row_of_position.to(device))


def _blocked_row_decode(q_row, k_row, v_row, segments: list[Segment], offset: int, sdpa: Callable):
    """Sq < Sk (a KV cache): few queries, so an explicit bottom-right mask per document is cheap."""
    parts = []
    for seg in segments:
        k_idx = seg.k_index.to(k_row.device)
        q_seg = q_row.index_select(1, seg.q_index.to(q_row.device)).unsqueeze(0)
        k_seg, v_seg = (t.index_select(1, k_idx).unsqueeze(0) for t in (k_row, v_row))
        parts.append(sdpa(q_seg, k_seg, v_seg, seg, seg.q_index + offset)[0])
    inverse = torch.argsort(torch.cat([seg.q_index for seg in segments]))  # inverts the permutation
    return torch.cat(parts, dim=1).index_select(1, inverse.to(q_row.device))


def blocked_attention(q, k, v, doc_ids=None, *, scale=None, window=None, anchor="window"):
    batch, _, sq, _ = q.shape
    sk = k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if doc_ids is None:
        return dense_attention(q, k, v, None, scale=scale, window=window)
    if batch == 1:  # views, not unbind/stack: each of those costs a full-size copy in backward
        q_rows, k_rows, v_rows = ([t.squeeze(0)] for t in (q, k, v))
    else:
        q_rows, k_rows, v_rows = q.unbind(0), k.unbind(0), v.unbind(0)
    outputs = []
    for doc_row, q_row, k_row, v_row in zip(_rows(doc_ids, batch), q_rows, k_rows, v_rows):
        segments = document_segments(doc_row, sk, sq)
        sdpa = functools.partial(
            _segment_sdpa, doc_row=doc_row.cpu(), scale=scale, gqa=gqa, window=window, anchor=anchor
        )
        if sq == sk:
            outputs.append(_blocked_row_prefill(q_row, k_row, v_row, segments, sdpa))
        else:
            outputs.append(_blocked_row_decode(q_row, k_row, v_row, segments, sk - sq, sdpa))
    return outputs[0].unsqueeze(0) if batch == 1 else torch.stack(outputs)


@dataclass
class VarlenLayout:
    """flash_attn_varlen_func's inputs for a batch: which flat tokens form each sequence."""

    q_index: torch.Tensor  # long [Nq] into the flattened [B*Sq] queries
    k_index: torch.Tensor  # long [Nk] into the flattened [B*Sk] keys; anchor keys repeat per document
    cu_seqlens_q: torch.Tensor  # int32 [num_seqs + 1]
    cu_seqlens_k: torch.Tensor  # int32 [num_seqs + 1]
    max_seqlen_q: int
    max_seqlen_k: int
    runs: bool  # every sequence one contiguous run of its row: where flash's window is the layer's (module doc)


def varlen_layout(doc_ids: torch.Tensor | None, batch: int, kv_len: int, q_len: int) -> VarlenLayout:
    """One varlen sequence per (row, document): the anchor's K/V prepended to each document."""
    q_parts, k_parts = [], []
    runs = True
    for b, doc_row in enumerate(_rows(doc_ids, batch)):
        for seg in document_segments(doc_row, kv_len, q_len):
            runs = runs and not seg.num_prefix and _is_run(seg.k_index)
            q_parts.append(seg.q_index + b * q_len)
            k_parts.append(seg.k_index + b * kv_len)
    len_q, len_k = [part.numel() for part in q_parts], [part.numel() for part in k_parts]

    def cumulative(lengths):
        return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32)

    cu_seqlens = cumulative(len_q), cumulative(len_k)
    return VarlenLayout(torch.cat(q_parts), torch.cat(k_parts), *cu_seqlens, max(len_q), max(len_k), runs)


def _flash_varlen_func() -> Callable:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError as err:
        raise RuntimeError(
            "the flash implementation needs flash-attn on a CUDA machine: pip install 'evalkit[gpu]'"
        ) from err
    return flash_attn_varlen_func


def flash_attention(
    q, k, v, doc_ids=None, *, scale=None, window=None, anchor="window", varlen_func: Callable | None = None
):
    """Regroup tokens by document, run a varlen causal kernel, scatter back. varlen_func: tests pass
    an emulation of flash_attn_varlen_func (tests/attention/varlen.py) to check the layout on a CPU."""
    if varlen_func is None:
        varlen_func = _flash_varlen_func()
        if q.dtype not in (torch.float16, torch.bfloat16) or not q.dtype == k.dtype == v.dtype:
            raise ValueError(
                f"flash-attn runs fp16 or bf16 of one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}: "
                "train with dtype=bf16 (autocast), or use the flex or blocked implementation"
            )
    batch, hq, sq, dim = q.shape
    sk = k.shape[2]
    layout = varlen_layout(doc_ids, batch, sk, sq)
    window = _effective_window(window, sk)
    window_options = {} if window is None else {"window_size": (window - 1, 0)}  # flash-attn: keys i-left..i
    if window is not None and not layout.runs:
        raise ValueError(
            "the flash implementation cannot combine a sliding window with the anchor or interleaved "
            "documents; use flex (CUDA) or blocked"
        )
    device = q.device
    q_flat, k_flat, v_flat = (t.transpose(1, 2).flatten(0, 1) for t in (q, k, v))  # [B*S, H, D]
    k_index = layout.k_index.to(device)
    out = varlen_func(
        q_flat.index_select(0, layout.q_index.to(device)),
        k_flat.index_select(0, k_index),
        v_flat.index_select(0, k_index),
        cu_seqlens_q=layout.cu_seqlens_q.to(device),
        cu_seqlens_k=layout.cu_seqlens_k.to(device),
        max_seqlen_q=layout.max_seqlen_q,
        max_seqlen_k=layout.max_seqlen_k,
        softmax_scale=scale,
        causal=True,
        **window_options,
    )
    out = out.index_select(0, torch.argsort(layout.q_index).to(device))  # argsort inverts the permutation
    return out.reshape(batch, sq, hq, dim).transpose(1, 2)


_last_block_mask: dict[str, Any] = {}  # the BlockMask built last: its "key", "doc_ids" and "mask"


def _cached_block_mask(doc_ids, batch: int, q_len: int, kv_len: int, device, window, anchor):
    """The BlockMask, reused while doc_ids do not change (every layer of one forward shares it), keyed
    on a copy of their values, not the tensor's address: a new batch can reuse freed memory."""
    key = (batch, q_len, kv_len, str(device), None if doc_ids is None else tuple(doc_ids.shape), window, anchor)
    last = _last_block_mask
    # An equal key means doc_ids of the same shape, or None on both sides.
    if key != last.get("key") or (doc_ids is not None and not torch.equal(doc_ids, last["doc_ids"])):
        mask = _build_block_mask(doc_ids, batch, q_len, kv_len, device, window, anchor)
        last.update(key=key, doc_ids=None if doc_ids is None else doc_ids.clone(), mask=mask)
    return last["mask"]


def _build_block_mask(doc_ids, batch: int, q_len: int, kv_len: int, device, window=None, anchor="window"):
    from torch.nn.attention.flex_attention import create_block_mask

    offset = kv_len - q_len
    doc = None if doc_ids is None else doc_ids.to(device).expand(batch, -1).contiguous()  # [B, Sk]

    def mask_mod(b, h, q_idx, kv_idx):
        # masks.py's rule; the branches test constants, so each mask traces to the rule it needs
        allowed = q_idx + offset >= kv_idx
        seen = None if window is None else q_idx + offset - kv_idx < window
        if doc is not None:
            is_anchor = doc[b, kv_idx] == ANCHOR_DOC_ID
            allowed = allowed & ((doc[b, q_idx + offset] == doc[b, kv_idx]) | is_anchor)
            if seen is not None and anchor == "sink":
                seen = seen | is_anchor
        return allowed if seen is None else allowed & seen

    # On CUDA the block mask is built by a compiled kernel: the eager build of a 64K mask is
    # minutes of work and S^2 memory. Elsewhere eager is fine (CPU flex serves tests only).
    compiled = torch.device(device).type == "cuda"
    rows = None if doc is None else batch
    return create_block_mask(mask_mod, rows, None, q_len, kv_len, device=device, _compile=compiled)


COMPILE_DEVICES = {"cuda"}  # where FlexAttention runs compiled; tests add "cpu" to count compiles on a CPU
COMPILE_BACKEND = "inductor"  # the fused kernels; tests of compile accounting may take "eager" (Dynamo alone)
# One compiled function per variant (dtype, head dim, mask kind, dynamic): see flex_attention_function.
_compiled_flex: dict[tuple, Callable] = {}


def _flex_frame() -> Callable:
    """A function that calls flex_attention, with a code object of its own. Dynamo keeps its
    compiled graphs, and counts them against its recompile limit, per code object, however many
    torch.compile wrappers share it: one compiled flex_attention seeing two dtypes, two mask
    functions, two head dims and many lengths reaches the limit (default 8) and then runs eager,
    materialising the Sq x Sk scores (hundreds of GB at 64K). A frame per variant gives each
    variant its own graphs and its own count (tests count them per frame)."""
    from torch.nn.attention.flex_attention import flex_attention

    def call(q, k, v, *, block_mask, scale=None, enable_gqa=False, kernel_options=None):
        return flex_attention(
            q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa, kernel_options=kernel_options
        )

    call.__code__ = call.__code__.replace()  # a copy: a code object of this variant's alone
    return call


def flex_attention_function(device: torch.device, dynamic: bool = False, variant: tuple = ()) -> Callable:
    """Compiled FlexAttention on CUDA; eager elsewhere (correct, but it materialises scores).
    Training windows have one shape (static compile); serving prefills change length every step
    (`dynamic=True`). `variant` names what else changes the graph (dtype, head dim, mask kind):
    each (variant, dynamic) is compiled once per process, as its own function."""
    from torch.nn.attention.flex_attention import flex_attention

    if device.type not in COMPILE_DEVICES:
        return flex_attention
    key = (*variant, dynamic)
    if key not in _compiled_flex:
        frame = _flex_frame()
        # fullgraph: a graph break would run FlexAttention eagerly (scores materialised: 128 GiB
        # at 64K) without a word; it is an error here instead.
        compiled = torch.compile(frame, dynamic=dynamic, backend=COMPILE_BACKEND, fullgraph=True)
        compiled.frame = frame  # type: ignore[attr-defined]  # the tests count graphs per frame
        _compiled_flex[key] = compiled
    return _compiled_flex[key]


# torch's CUDA lowering of FlexAttention (torch/_inductor/kernel/flex/flex_decoding.py,
# _use_flex_decoding, torch 2.11 to 2.13) takes its decoding kernel below this many queries Q when
# the query heads per key-value head, G, are a power of two: each graph is guarded on Q < 128 or not.
FLEX_DECODING_QUERIES = 128


def _flex_kernel_options(num_queries: int, group: int, dynamic: bool) -> dict[str, Any] | None:
    """The general kernel where the decoding kernel could have no config: it packs a key-value head's
    G query heads into a tile of max(next_power_of_2(Q * G), 16) rows, Q the graph's compiling one,
    and drops every config unless the tile divides the BlockMask's 128-query block, so 128 / G < Q <
    128 fails to compile (NoValidChoicesError; fixed after torch 2.13 by pytorch PR #185349). A
    static graph compiles at this Q; a dynamic one serves 2 to 127 queries (Dynamo specialises 1)
    from whichever came first, so its options hold for all of them (options that differ within it
    would split it: a recompile, an error under vLLM's stance)."""
    compiled_at = FLEX_DECODING_QUERIES - 1 if dynamic and num_queries > 1 else num_queries
    overflows = compiled_at * group > 128  # the BlockMask's block: create_block_mask's default, evalkit's
    return {"FORCE_USE_FLEX_ATTENTION": True} if num_queries < FLEX_DECODING_QUERIES and overflows else None


def run_flex(q, k, v, block_mask, *, scale, mask_kind: str, dynamic: bool = False) -> torch.Tensor:
    """FlexAttention through the function of its variant: what besides the lengths changes the
    compiled graph (dtype, head dim, mask kind). Off COMPILE_DEVICES, where evalkit runs it
    uncompiled on purpose, torch's "called without torch.compile" warning is silenced; on a compiled
    device it would mean that the compiled path was lost, so it is left to be seen."""
    variant = (str(q.dtype).removeprefix("torch."), q.shape[-1], mask_kind)
    function = flex_attention_function(q.device, dynamic=dynamic, variant=variant)
    options = {"block_mask": block_mask, "scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
    options["kernel_options"] = _flex_kernel_options(q.shape[2], q.shape[1] // k.shape[1], dynamic)
    if q.device.type in COMPILE_DEVICES:
        return function(q, k, v, **options)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        return function(q, k, v, **options)


def raise_recompile_limit(limit: int) -> None:
    """Dynamo's per-function recompile limit at least `limit` (it is one setting for the process:
    never lowered here, so another function's needs are kept)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(recompile_limit(), limit))


def recompile_limit() -> int:
    """Dynamo's per-function compile limit (renamed across torch versions)."""
    config = torch._dynamo.config
    return int(getattr(config, "recompile_limit", None) or config.cache_size_limit)


def flex_attention(q, k, v, doc_ids=None, *, scale=None, window=None, anchor="window"):
    if q.device.type == "cpu":
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise RuntimeError("FlexAttention has no backward pass on CPU: train with impl='blocked'")
        q, k, v = q.detach(), k.detach(), v.detach()  # torch refuses CPU inputs that require grad
    block_mask = _cached_block_mask(doc_ids, q.shape[0], q.shape[2], k.shape[2], q.device, window, anchor)
    return run_flex(q, k, v, block_mask, scale=scale, mask_kind="causal" if doc_ids is None else "documents")


_FUNCTIONS: dict[str, Callable] = {
    "dense": dense_attention,
    "blocked": blocked_attention,
    "flex": flex_attention,
    "flash": flash_attention,
}
IMPLEMENTATIONS = tuple(_FUNCTIONS)


def default_implementation(device: torch.device) -> str:
    """flex on CUDA (fused kernels, forward and backward); blocked on CPU."""
    return "flex" if device.type == "cuda" else "blocked"


def available_implementations(device: torch.device | str = "cpu") -> list[str]:
    """Implementations that can run (forward and backward) on `device` in this environment."""
    device = torch.device(device)
    names = ["dense", "blocked"]
    if device.type == "cuda":
        names.append("flex")
        with contextlib.suppress(RuntimeError):  # flash-attn absent
            _flash_varlen_func()
            names.append("flash")
    return names


def one_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v in one dtype, each rounded once (autograd carries the gradient through the cast):
    autocast's when it is on for q's device, else v's, the model's compute dtype (v is never rotated;
    an fp32 rotation, rope_precision=fp32 or fp32 cos/sin under autocast, hands over q and k in fp32,
    so q·k runs in bf16 as the paper's text has it). flash-attn refuses the mix, FlexAttention refuses
    it or runs an fp32 kernel whose numbers differ from SDPA's: every implementation gets the same inputs."""
    device_type = q.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else v.dtype
    return q.to(dtype), k.to(dtype), v.to(dtype)


def document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    doc_ids: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    impl: str = "auto",
    window: int | None = None,
    anchor: str = "window",
) -> torch.Tensor:
    """Attention under the document rule (masks.py) with the chosen implementation (shapes: module
    docstring; doc_ids may also be [Sk]), within the layer's sliding `window` when given (`anchor`:
    how the anchor meets it, masks.ANCHOR_MODES), computed in one dtype (one_dtype)."""
    _check_shapes(q, k, v, doc_ids)
    q, k, v = one_dtype(q, k, v)
    check_window(window, anchor)
    window = _effective_window(window, k.shape[2])  # flash, which tests call directly, applies it too
    name = default_implementation(q.device) if impl == "auto" else impl
    if name not in _FUNCTIONS:
        raise ValueError(
            f"unknown attention implementation {impl!r}; choose auto or one of: {', '.join(IMPLEMENTATIONS)}"
        )
    return _FUNCTIONS[name](q, k, v, doc_ids, scale=scale, window=window, anchor=anchor)
