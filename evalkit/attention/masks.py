"""The definition of who may attend to whom, as plain dense masks.

Everything else (the fast kernels, the vLLM backend) is tested against these. Rule, for a key
column j and a query row i (True = may attend):

    j <= i  and  (doc[i] == doc[j]  or  doc[j] == ANCHOR_DOC_ID)        (document masks)
    j <= i                                                              (doc_ids is None: causal)

When there are fewer queries than keys (decoding with a KV cache) the queries are the last keys:
causality is aligned bottom-right.
"""

from __future__ import annotations

import torch

from evalkit.attention.packing import ANCHOR_DOC_ID, PackedSequence


def document_mask(doc_ids: torch.Tensor | None, kv_len: int, q_len: int | None = None) -> torch.Tensor:
    """Bool mask [..., q_len, kv_len] for key doc ids `doc_ids` [..., kv_len] (None: plain causal)."""
    q_len = kv_len if q_len is None else q_len
    if q_len > kv_len:
        raise ValueError(f"more queries ({q_len}) than keys ({kv_len})")
    device = doc_ids.device if doc_ids is not None else None
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)
    k_pos = torch.arange(kv_len, device=device)
    causal = k_pos[None, :] <= q_pos[:, None]
    if doc_ids is None:
        return causal
    if doc_ids.shape[-1] != kv_len:
        raise ValueError(f"doc_ids has {doc_ids.shape[-1]} entries for {kv_len} keys")
    doc_k = doc_ids[..., None, :]
    doc_q = doc_ids[..., kv_len - q_len :, None]
    return causal & ((doc_q == doc_k) | (doc_k == ANCHOR_DOC_ID))


def reference_mask(packed: PackedSequence) -> torch.Tensor:
    """Bool [S, S]: True where query row i may attend key column j under the window's paradigm."""
    return document_mask(packed.attention_doc_ids(), packed.seq_len)
