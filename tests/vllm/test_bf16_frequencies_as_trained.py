"""Serving as trained, frequencies "bf16": the plugin's cos/sin table is the one transformers' rotary
module computes once its inverse frequencies are rounded to bf16, as a bf16 trainer holds them.

Reference: transformers' LlamaRotaryEmbedding built from the same config, its inv_freq cast to bf16
(what regime.cast_buffers does in training). The plugin's module gets the fp32 frequencies that
transformers computed from that config through a stand-in for vLLM's RotaryEmbedding (no vLLM here).
"""

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from evalkit.vllm_plugin.rope import RopeOptions, ServingRotaryEmbedding

POSITIONS = 1024
CONFIG = LlamaConfig(hidden_size=128, num_attention_heads=4, max_position_embeddings=POSITIONS)
HEAD = CONFIG.hidden_size // CONFIG.num_attention_heads


class RotaryEmbedding:
    """What ServingRotaryEmbedding reads of vLLM's RotaryEmbedding (named as it is): its shape,
    its fp32 inverse frequencies and, for the cast variant, the cos/sin cache it replaces."""

    head_size = rotary_dim = HEAD
    is_neox_style = True
    base = 10000.0

    def __init__(self, inv_freq: torch.Tensor, dtype: torch.dtype) -> None:
        self.inv_freq = inv_freq
        self.max_position_embeddings = POSITIONS
        self.cos_sin_cache = torch.empty(0, dtype=dtype)

    def _compute_inv_freq(self, base: float) -> torch.Tensor:
        return self.inv_freq


def transformers_cos_sin(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp32 frequencies transformers computed, cos, sin [positions, HEAD / 2] in `dtype`) with
    inv_freq held in bf16."""
    rotary = LlamaRotaryEmbedding(CONFIG)
    computed = rotary.original_inv_freq.clone()
    rotary.inv_freq = computed.to(torch.bfloat16)
    cos, sin = rotary(torch.zeros(1, dtype=dtype), torch.arange(POSITIONS)[None])
    return computed, cos[0, :, : HEAD // 2], sin[0, :, : HEAD // 2]


@pytest.mark.parametrize("variant, dtype", [("fp32", torch.float32), ("cast", torch.bfloat16)])
def test_the_table_is_transformers_with_bf16_frequencies(variant, dtype):
    computed, cos, sin = transformers_cos_sin(dtype)
    original = RotaryEmbedding(computed, dtype)
    served = ServingRotaryEmbedding(original, RopeOptions(variant, frequencies="bf16"), POSITIONS)
    # fp32: the module's own fp32 table; cast: vLLM's cache in the model's dtype, as transformers returns it.
    table = served.cos_sin_fp32 if variant == "fp32" else original.cos_sin_cache
    assert table.dtype == dtype
    ours_cos, ours_sin = table.chunk(2, dim=-1)
    torch.testing.assert_close(ours_cos, cos, atol=1e-6, rtol=0)  # a few fp32 spacings of cos
    torch.testing.assert_close(ours_sin, sin, atol=1e-6, rtol=0)
    # The rounding matters at these positions: fp32 frequencies give another table.
    stock = ServingRotaryEmbedding(RotaryEmbedding(computed, torch.float32), RopeOptions("fp32"), POSITIONS)
    assert (stock.cos_sin_fp32.chunk(2, dim=-1)[0] - cos.float()).abs().max() > 0.05
