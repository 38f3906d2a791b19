"""evalkit attention inside unmodified transformers models (Llama, Qwen2, Mistral, ...).

After `register_hf_attention()`, load or build a model with `attn_implementation="evalkit"`
(or "evalkit_blocked", "evalkit_dense", "evalkit_flex", "evalkit_flash" to pin one) and call it
with `position_ids=` and `doc_ids=` (from `pack`); doc_ids=None gives plain causal attention.
transformers forwards unknown keyword arguments of the model call down to the attention
function, which is how doc_ids reach every layer without patched model files.
"""

from __future__ import annotations

import torch

from evalkit.attention.kernels import IMPLEMENTATIONS, document_attention

HF_NAMES: dict[str, str] = {"evalkit": "auto", **{f"evalkit_{name}": name for name in IMPLEMENTATIONS}}


def _attention_forward(impl: str):
    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, doc_ids=None, **kwargs):
        if dropout and module.training:
            raise ValueError("evalkit attention does not implement attention dropout; set attention_dropout=0")
        if kwargs.get("sliding_window"):
            raise ValueError("evalkit attention does not implement sliding-window attention")
        out = document_attention(query, key, value, doc_ids, scale=scaling, impl=impl)
        return out.transpose(1, 2).contiguous(), None

    forward.__name__ = f"evalkit_{impl}_attention_forward"
    return forward


def _no_padding_mask(*, attention_mask=None, **_kwargs):
    """transformers' mask hook: evalkit takes document ids, not dense masks, and has no padding."""
    if attention_mask is not None and not bool(torch.all(attention_mask)):
        raise ValueError(
            "evalkit attention does not take padded batches; pack documents with doc_ids or use equal lengths"
        )
    return None


def register_hf_attention() -> list[str]:
    """Register evalkit's implementations with transformers; returns the names (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name, impl in HF_NAMES.items():
        AttentionInterface.register(name, _attention_forward(impl))
        AttentionMaskInterface.register(name, _no_padding_mask)
    return list(HF_NAMES)
