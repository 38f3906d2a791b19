"""What a model's config declares about attention, checked in one place against what evalkit's
attention paths reproduce (docs/models.md's table): evalkit replaces only the attention kernel, so
what the model computes before it stays its own; what else changes the scores is refused here.
"""

from __future__ import annotations

from pathlib import Path

from evalkit.attention.masks import ANCHOR_MODES
from evalkit.errors import UserError
from evalkit.models.refs import checkpoint_meta

ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention"}


def layer_windows(config) -> list[int | None]:
    """Each layer's sliding window as the model applies it (None: global attention)."""
    text = config.get_text_config()
    window = getattr(text, "sliding_window", None)
    if getattr(text, "use_sliding_window", True) is False:
        window = None
    layer_types = getattr(text, "layer_types", None)
    if layer_types is None:  # Mistral: one window, on every layer
        return [window or None] * int(text.num_hidden_layers)
    return [window if kind == "sliding_attention" and window else None for kind in layer_types]


def windows_shorter_than(config, length: int) -> list[int]:
    """The windows of the layers that cannot see `length` tokens back (empty: none is windowed there)."""
    return [w for w in layer_windows(config) if w is not None and w < length]


def unsupported_attention_features(config) -> list[str]:
    """What this config declares that evalkit's attention does not reproduce (empty: nothing)."""
    text = config.get_text_config()
    softcap = getattr(text, "attn_logit_softcapping", None)
    chunk = getattr(text, "attention_chunk_size", None)
    other_layers = sorted(set(getattr(text, "layer_types", None) or ()) - ATTENTION_LAYER_TYPES)
    alibi = bool(getattr(text, "alibi", False)) or getattr(text, "position_embedding_type", "") == "alibi"
    problems = {
        f"attention logit soft-capping (attn_logit_softcapping={softcap})": bool(softcap),
        "ALiBi position biases": alibi or getattr(text, "model_type", "") in ("bloom", "mpt"),
        "attention sinks (learned per-head sink logits)": getattr(text, "model_type", "") == "gpt_oss",
        "bidirectional attention (use_bidirectional_attention)": bool(getattr(text, "use_bidirectional_attention", 0)),
        f"chunked attention (attention_chunk_size={chunk})": bool(chunk),
        f"layers of type {', '.join(other_layers)}": bool(other_layers),
    }
    return [name for name, present in problems.items() if present]


def check_attention_supported(config, what: str) -> None:
    """A one-line UserError naming every unsupported feature `what` (a command) would need."""
    problems = unsupported_attention_features(config)
    if problems:
        raise UserError(
            f"{what} cannot reproduce this model's attention exactly: {'; '.join(problems)} "
            "(evalkit's attention is causal softmax attention with per-layer sliding windows)"
        )


def trained_window_anchor(path: Path) -> str:
    """How the checkpoint was trained to meet sliding windows with the anchor (meta.json's
    attention.window_anchor, which evalkit's trainer writes): "window" where nothing is recorded
    (other checkpoints, and runs from before the setting: they trained under the model's own mask)."""
    attention = checkpoint_meta(Path(path)).get("attention")
    reading = attention.get("window_anchor", "window") if isinstance(attention, dict) else "window"
    if reading not in ANCHOR_MODES:
        raise UserError(
            f"{path}/meta.json records window_anchor {reading!r}; this evalkit serves {', '.join(ANCHOR_MODES)}"
        )
    return reading
