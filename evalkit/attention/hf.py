"""evalkit attention inside unmodified transformers models (docs/attention.md: the names to load with).

transformers forwards unknown keyword arguments of the model call down to the attention
function, which is how doc_ids reach every layer without patched model files.
"""

from __future__ import annotations

import torch

from evalkit.attention.kernels import IMPLEMENTATIONS, document_attention, one_dtype


def hf_name(impl: str) -> str:
    """transformers' attn_implementation for an evalkit implementation (auto: "evalkit").

    flash registers as evalkit_varlen: transformers 5.x takes every name containing "flash" for
    a flash-attention kernel to fetch from its hub, and fails to build the model with it.
    """
    return "evalkit" if impl == "auto" else f"evalkit_{'varlen' if impl == 'flash' else impl}"


HF_NAMES: dict[str, str] = {hf_name(name): name for name in ("auto", *IMPLEMENTATIONS)}


def _attention_forward(impl: str):
    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, doc_ids=None, **kwargs):
        if dropout and module.training:
            raise ValueError("evalkit attention does not implement attention dropout; set attention_dropout=0")
        # transformers hands each sliding layer its window (None on global layers); evalkit
        # applies it on top of the document rule, the anchor meeting it as window_anchor says.
        window, anchor = kwargs.get("sliding_window") or None, kwargs.get("window_anchor", "window")
        if kwargs.get("softcap") or kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
            raise ValueError(
                "evalkit attention does not implement soft-capping or attention sinks (attention.features)"
            )
        out = document_attention(query, key, value, doc_ids, scale=scaling, impl=impl, window=window, anchor=anchor)
        return out.transpose(1, 2).contiguous(), None

    forward.__name__ = f"evalkit_{impl}_attention_forward"
    return forward


# How q and k are rotated under mixed precision (the paper's variable): docs/training.md's "Precision" table.
ROPE_PRECISIONS = ("fp32", "bf16")


def _fp32_angles(module, args):
    """Before the rotary module: an fp32 stand-in for the hidden states it is given, so it returns
    cos/sin computed and kept in fp32 even in a bf16 model (it reads only their dtype and device;
    an expanded scalar has their shape and costs no memory)."""
    hidden, *rest = args
    if hidden.dtype == torch.float32:
        return None
    return (torch.zeros((), dtype=torch.float32, device=hidden.device).expand(hidden.shape), *rest)


def _rope_precision_hook(precision: str):
    def cast(module, args, output):
        cos, sin = output
        if precision == "fp32":
            return cos.float(), sin.float()
        if torch.is_autocast_enabled(cos.device.type):  # without autocast they already are the activations'
            dtype = torch.get_autocast_dtype(cos.device.type)
            return cos.to(dtype), sin.to(dtype)
        return output

    return cast


def rotary_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that compute RoPE's cos/sin tables (one per model in Llama, Qwen2, Mistral)."""
    return [module for module in model.modules() if type(module).__name__.endswith("RotaryEmbedding")]


def set_rope_precision(model: torch.nn.Module, precision: str) -> list:
    """Make the model rotate q and k in `precision` (ROPE_PRECISIONS) under autocast. transformers'
    rotary module returns cos/sin in its input's dtype (fp32 with fp32 master weights whatever
    autocast does, bf16 in a bf16 model); hooks on it set their dtype instead (_fp32_angles: nothing
    rounded on the way), in every layer of every architecture built on it, without patched files.
    Returns the hooks' handles, for a caller that removes them again (the probe)."""
    if precision not in ROPE_PRECISIONS:
        raise ValueError(f"rope precision must be one of {', '.join(ROPE_PRECISIONS)}, got {precision!r}")
    modules = rotary_modules(model)
    if not modules:
        raise ValueError(f"{type(model).__name__} has no rotary embedding module to set the RoPE precision of")
    handles = []
    for module in modules:
        for handle in getattr(module, "_evalkit_rope_hooks", []):
            handle.remove()  # setting it again replaces the earlier setting
        hooks = [module.register_forward_hook(_rope_precision_hook(precision))]
        if precision == "fp32":
            hooks.append(module.register_forward_pre_hook(_fp32_angles))
        module._evalkit_rope_hooks = hooks  # type: ignore[assignment]  # torch types Module attributes Tensor | Module
        handles += hooks
    return handles


def cast_buffers(model: torch.nn.Module, rope_precision: str) -> None:
    """bf16_full: every floating buffer to bf16, as casting the whole model does; RoPE's
    frequencies (computed in fp32 at construction, as the model computes them) are cast too,
    unless the rotation is to be fp32."""
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding") and rope_precision == "fp32":
            continue
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer.is_floating_point():
                setattr(module, name, buffer.to(torch.bfloat16))


def no_padding_mask(*, attention_mask=None, **_kwargs):
    """transformers' mask hook of evalkit's attention and the probe's: document ids, not dense masks; no padding."""
    if attention_mask is not None and not bool(torch.all(attention_mask)):
        raise ValueError(
            "evalkit attention does not take padded batches; pack documents with doc_ids or use equal lengths"
        )
    return None


def register_hf_attention() -> list[str]:
    """Register evalkit's implementations with transformers; returns the names (idempotent)."""
    return [register_attention(name, _attention_forward(impl), no_padding_mask) for name, impl in HF_NAMES.items()]


def register_attention(name: str, forward, mask=None) -> str:
    """`forward` registered with transformers as the attention called `name`, with `mask` as its
    mask function (None: SDPA's)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, mask or sdpa_mask)
    return name


GROUPED_SDPA = "evalkit_grouped_sdpa"


def register_grouped_sdpa() -> str:
    """Register transformers' SDPA attention with one change at decoding (one query per row): the
    query heads sharing a key-value head become that head's queries, so one SDPA call reads each
    K/V once (the same products and sums per query, in the same order). With the padding mask it
    gets at every decoding step of a padded batch, transformers' SDPA repeats each key-value head
    instead (repeat_kv, in 5.19; 5.24 packs): ~150 MB per layer per step at 8 rows x 4K on SmolLM2,
    more than the attention itself reads. Returns the name to load with."""
    return register_attention(GROUPED_SDPA, _grouped_sdpa_forward)


def _grouped_sdpa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    query, key, value = one_dtype(query, key, value)  # an fp32 rotation (rope_precision) hands over q, k in fp32
    batch, heads, queries, head_dim = query.shape
    groups = heads // key.shape[1]
    plain = groups == 1 or queries != 1 or module.training or kwargs.get("softcap") is not None
    mask_per_row = attention_mask is None or (attention_mask.ndim == 4 and attention_mask.shape[1] == 1)
    if plain or not mask_per_row or kwargs.get("position_bias") is not None or kwargs.get("sinks") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if attention_mask is not None:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]  # [B, 1, 1, C]: the same for every head
    # Query head h reads key-value head h // groups (transformers' repeat_kv order).
    grouped = query.reshape(batch, key.shape[1], groups, head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, heads, 1, head_dim).transpose(1, 2).contiguous(), None


ANCHOR_SINK_SDPA = "evalkit_anchor_sink_sdpa"


def register_anchor_sink_sdpa() -> str:
    """Register transformers' SDPA with the anchor (key 0) visible to every query of a sliding layer
    beyond its window (a packed request's question and decoded tokens on a model trained with
    window_anchor="sink", attention.masks). Valid for one unpadded row whose cache holds every key
    from the anchor on, as the hf engine's packed requests on windowed models. Returns the name."""
    return register_attention(ANCHOR_SINK_SDPA, _anchor_sink_sdpa_forward)


def _anchor_sink_sdpa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if kwargs.get("sliding_window") and attention_mask is not None:  # None: every earlier key is visible
        # Key 0, the anchor, attended by every query (it precedes them all: causality holds), in a
        # copy since layers may share the mask [B, 1, Q, K] (bool: True attends; float: 0 attends).
        attention_mask = attention_mask.clone()
        attention_mask[..., 0] = True if attention_mask.dtype == torch.bool else 0.0
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
