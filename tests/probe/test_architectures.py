"""The probe on unmodified transformers Qwen2 and Mistral models (grouped-query heads included)."""

import pytest
import torch
from transformers import MistralConfig, Qwen2Config

from evalkit.probe import measure_shifts
from tests.probe.conftest import build

SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.05,
)
CONFIGS = {"qwen2": lambda: Qwen2Config(**SMALL), "mistral": lambda: MistralConfig(sliding_window=None, **SMALL)}


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_probe_runs_and_matches_eager_attention(family, texts):
    config = CONFIGS[family]()
    low = build(config, torch.bfloat16)
    probed = low(input_ids=texts).last_hidden_state
    low.set_attn_implementation("eager")
    torch.testing.assert_close(probed, low(input_ids=texts).last_hidden_state, rtol=0, atol=2e-2)
    low.set_attn_implementation("evalkit_probe")

    full = build(config, torch.float32)
    for rope in ("cast", "fp32"):
        shifted, same = measure_shifts(low, texts, [0, 16], 16, rope=rope)
        assert shifted.total > 1e-3 and same.total == 0.0
        (reference,) = measure_shifts(full, texts, [0], 16, rope=rope)
        assert reference.total < 1e-5
