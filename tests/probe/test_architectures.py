"""The probe on unmodified transformers Qwen2 and Mistral models (grouped-query heads included)."""

import pytest
import torch
from transformers import MistralConfig, Qwen2Config

from evalkit.probe import measure_shifts
from evalkit.probe.run import model_window
from tests.helpers import probe_config, probe_model

CONFIGS = {"qwen2": lambda: probe_config("qwen2"), "mistral": lambda: probe_config("mistral")}


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_probe_runs_and_matches_eager_attention(family, texts):
    config = CONFIGS[family]()
    low = probe_model(config, torch.bfloat16)
    probed = low(input_ids=texts).last_hidden_state
    low.set_attn_implementation("eager")
    torch.testing.assert_close(probed, low(input_ids=texts).last_hidden_state, rtol=0, atol=2e-2)
    low.set_attn_implementation("evalkit_probe")

    full = probe_model(config, torch.float32)
    for rope in ("cast", "fp32"):
        shifted, same = measure_shifts(low, texts, [0, 16], 16, rope=rope)
        assert shifted.total > 1e-3 and same.total == 0.0
        (reference,) = measure_shifts(full, texts, [0], 16, rope=rope)
        assert reference.total < 1e-5


def test_sliding_windows_do_not_bound_the_probe_the_model_window_does():
    assert model_window(MistralConfig(sliding_window=32, max_position_embeddings=128)) == 128
    assert model_window(MistralConfig(sliding_window=None, max_position_embeddings=128)) == 128
    assert model_window(Qwen2Config(max_position_embeddings=512)) == 512
