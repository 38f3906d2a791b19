"""The definition of who may attend to whom (docs/attention.md's rule), as plain dense masks:
everything else (the fast kernels, the vLLM backend) is tested against these. With fewer queries
than keys, the queries are the last keys (decoding with a KV cache: bottom-right). ANCHOR_MODES,
under a sliding window: "window" (the default) keeps the model's own mask, the anchor seen only
within the window; "sink" keeps it visible to every query (StreamingLLM's reading).
"""

from __future__ import annotations

import torch

from evalkit.attention.packing import ANCHOR_DOC_ID, PackedSequence

ANCHOR_MODES = ("window", "sink")


def check_window(window: int | None, anchor: str = "window") -> None:
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"a sliding window is a positive number of tokens, got {window!r}")
    if anchor not in ANCHOR_MODES:
        raise ValueError(f"anchor under a window must be one of {', '.join(ANCHOR_MODES)}, got {anchor!r}")


def document_mask(
    doc_ids: torch.Tensor | None,
    kv_len: int,
    q_len: int | None = None,
    *,
    window: int | None = None,
    anchor: str = "window",
) -> torch.Tensor:
    """Bool mask [..., q_len, kv_len] for key doc ids `doc_ids` [..., kv_len] (None: plain causal),
    with a sliding window of `window` tokens when given (docs/attention.md's rule)."""
    check_window(window, anchor)
    q_len = kv_len if q_len is None else q_len
    if q_len > kv_len:
        raise ValueError(f"more queries ({q_len}) than keys ({kv_len})")
    device = doc_ids.device if doc_ids is not None else None
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)
    k_pos = torch.arange(kv_len, device=device)
    allowed = k_pos[None, :] <= q_pos[:, None]
    if doc_ids is not None:
        if doc_ids.shape[-1] != kv_len:
            raise ValueError(f"doc_ids has {doc_ids.shape[-1]} entries for {kv_len} keys")
        key_is_anchor = doc_ids[..., None, :] == ANCHOR_DOC_ID
        same_doc = doc_ids[..., kv_len - q_len :, None] == doc_ids[..., None, :]
        allowed = allowed & (same_doc | key_is_anchor)
    if window is not None:
        in_window = (q_pos[:, None] - k_pos[None, :]) < window
        if anchor == "sink" and doc_ids is not None:
            in_window = in_window | key_is_anchor
        allowed = allowed & in_window
    return allowed


def reference_mask(packed: PackedSequence, window: int | None = None, anchor: str = "window") -> torch.Tensor:
    """Bool [S, S]: True where query row i may attend key column j under the window's paradigm
    (and a layer's sliding window, when given)."""
    return document_mask(packed.attention_doc_ids(), packed.seq_len, window=window, anchor=anchor)
