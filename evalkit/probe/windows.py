"""Which window each layer of a model attends over, as its config declares it, and the model's own window.

transformers declares sliding-window layers two ways: `layer_types` ("sliding_attention" or
"full_attention" per layer) with one `sliding_window` (Gemma 2 and 3, Qwen2/Qwen3 when they
slide, Cohere2, Ministral, ...), or a `sliding_window` alone that every layer slides (Mistral,
Phi-3). The model's window is what its global layers reach, max_position_embeddings: a
sequence longer than a sliding layer's window is still within the model, and the probe
measures every layer as it attends.
"""

from __future__ import annotations

from evalkit.errors import UserError
from evalkit.probe.attention import FULL_ATTENTION, SLIDING_ATTENTION

MEASURED_LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)


def model_window(config) -> int:
    """The longest sequence the probe measures on this model: the model's window, max_position_embeddings.

    Sliding-window layers do not shorten it: the probe applies each layer's window (a UserError for
    layer types it does not measure)."""
    declared_windows(config)
    window = getattr(config, "max_position_embeddings", None)
    if not window:
        raise UserError(f"the checkpoint's config ({config.model_type}) states no max_position_embeddings")
    return int(window)


def declared_windows(config) -> tuple[int | None, ...]:
    """Per layer: its sliding window, or None for full causal attention. A UserError for a layer type
    the probe does not measure (chunked or linear attention, ...)."""
    sliding = getattr(config, "sliding_window", None)
    layers = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if not types:
        return (sliding,) * layers
    unknown = sorted(set(types) - set(MEASURED_LAYER_TYPES))
    if unknown:
        raise UserError(
            f"the checkpoint's layer_types include {', '.join(unknown)}: the probe measures "
            f"{' and '.join(MEASURED_LAYER_TYPES)} layers only"
        )
    return tuple(sliding if kind == SLIDING_ATTENTION else None for kind in types[:layers])


def describe_window(config) -> str:
    """The model's window in words, e.g. "32768-token window (15 of its 18 layers slide over 512 tokens)"."""
    window = model_window(config)
    windows = declared_windows(config)
    sliding = [w for w in windows if w is not None and w < window]
    if not sliding:
        return f"{window}-token window"
    reach = ", ".join(str(w) for w in sorted(set(sliding)))
    which = "all its" if len(sliding) == len(windows) else f"{len(sliding)} of its"
    return f"{window}-token window ({which} {len(windows)} layers slide over {reach} tokens)"
