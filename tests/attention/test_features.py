"""The one check of what a config declares about attention (evalkit.attention.features)."""

import pytest
from transformers import (
    BloomConfig,
    Gemma2Config,
    Gemma3TextConfig,
    GptOssConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
)

from evalkit.attention.features import check_attention_supported, layer_windows, unsupported_attention_features
from evalkit.errors import UserError

SMALL = dict(num_hidden_layers=4, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)


def test_what_the_model_computes_itself_is_supported():
    # QK-norm and a RoPE base per layer type (Gemma 3) are the model's own; windows are evalkit's
    assert unsupported_attention_features(LlamaConfig(**SMALL)) == []
    assert unsupported_attention_features(Gemma3TextConfig(**SMALL, sliding_window=8)) == []
    assert unsupported_attention_features(MistralConfig(**SMALL, sliding_window=8)) == []


@pytest.mark.parametrize(
    "config, feature",
    [
        (Gemma2Config(**SMALL), "attention logit soft-capping (attn_logit_softcapping=50.0)"),
        (Gemma3TextConfig(**SMALL, use_bidirectional_attention=True), "bidirectional attention"),
        (GptOssConfig(**SMALL), "attention sinks"),
        (BloomConfig(n_layer=2, hidden_size=32, n_head=2), "ALiBi position biases"),
        (
            Qwen2Config(**SMALL, layer_types=["full_attention", "linear_attention"] * 2),
            "layers of type linear_attention",
        ),
    ],
)
def test_what_evalkit_cannot_reproduce_is_refused_in_one_line(config, feature):
    assert any(problem.startswith(feature) for problem in unsupported_attention_features(config))
    with pytest.raises(UserError) as caught:
        check_attention_supported(config, "evalkit probe")
    assert str(caught.value).startswith("evalkit probe cannot reproduce") and "\n" not in str(caught.value)


def test_each_layer_window_as_the_model_applies_it():
    gemma = Gemma3TextConfig(**SMALL, sliding_window=8, layer_types=["sliding_attention"] * 3 + ["full_attention"])
    assert layer_windows(gemma) == [8, 8, 8, None]
    assert layer_windows(MistralConfig(**SMALL, sliding_window=8)) == [8] * 4  # one window, every layer
    assert layer_windows(MistralConfig(**SMALL, sliding_window=None)) == [None] * 4
    assert layer_windows(Qwen2Config(**SMALL, sliding_window=8, use_sliding_window=False)) == [None] * 4
