"""The model's own window, as the probe measures it (each layer within its own sliding window, if any)."""

from __future__ import annotations

from evalkit.attention.features import layer_windows
from evalkit.errors import UserError


def model_window(config) -> int:
    """The longest sequence the probe measures on this model: max_position_embeddings."""
    window = getattr(config, "max_position_embeddings", None)
    if not window:
        raise UserError(f"the checkpoint's config ({config.model_type}) states no max_position_embeddings")
    return int(window)


def describe_window(config) -> str:
    """The model's window in words, e.g. "32768-token window (15 of its 18 layers slide over 512 tokens)"."""
    window = model_window(config)
    windows = layer_windows(config)
    sliding = [w for w in windows if w is not None and w < window]
    if not sliding:
        return f"{window}-token window"
    reach = ", ".join(str(w) for w in sorted(set(sliding)))
    which = "all its" if len(sliding) == len(windows) else f"{len(sliding)} of its"
    return f"{window}-token window ({which} {len(windows)} layers slide over {reach} tokens)"
