"""RoPE at serving time: the fp32 variant rotates in FP32 and rounds once; shifts and long windows work.

Reference for the fp32 variant: the rotation written out from RoPE's definition (inverse
frequencies base^(-2i/d), neox halves), in FP32, rounded to the activation dtype at the end.
Needs vLLM (its rotary modules are what the plugin wraps).
"""

import pytest
import torch

from .conftest import requires_vllm

pytestmark = requires_vllm

HEAD, ROT, HEADS, KV_HEADS, BASE = 32, 32, 4, 2, 10000.0


@pytest.fixture(scope="module")
def vllm_context():
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        yield


def stock_rotary(dtype, max_positions=64):
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    return RotaryEmbedding(HEAD, ROT, max_positions, BASE, True, dtype)


def fp32_reference(positions, x, dtype):
    """x [T, heads*HEAD] rotated in FP32 from the definition, rounded to `dtype` once."""
    inv_freq = 1.0 / BASE ** (torch.arange(0, ROT, 2, dtype=torch.float) / ROT)
    angles = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x = x.view(positions.numel(), -1, HEAD).float()
    x1, x2 = x[..., : ROT // 2], x[..., ROT // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(dtype).flatten(1)


def qk(dtype, tokens=7):
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, n * HEAD, generator=generator).to(dtype) for n in (HEADS, KV_HEADS))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fp32_variant_rotates_in_fp32_and_rounds_once(vllm_context, dtype):
    from evalkit.vllm_plugin.rope import RopeOptions, ServingRotaryEmbedding

    rotary = ServingRotaryEmbedding(stock_rotary(dtype), RopeOptions("fp32"), 64)
    query, key = qk(dtype)
    positions = torch.tensor([0, 1, 2, 5, 17, 40, 63])
    out_query, out_key = rotary(positions, query, key)
    assert out_query.dtype == dtype
    torch.testing.assert_close(out_query, fp32_reference(positions, query, dtype), atol=0, rtol=0)
    torch.testing.assert_close(out_key, fp32_reference(positions, key, dtype), atol=0, rtol=0)


def test_fp32_variant_differs_from_the_bf16_cast(vllm_context):
    from evalkit.vllm_plugin.rope import RopeOptions, ServingRotaryEmbedding

    query, key = qk(torch.bfloat16)
    positions = torch.arange(40, 47)
    stock_query, _ = stock_rotary(torch.bfloat16)(positions, query.clone(), key.clone())
    fp32_query, _ = ServingRotaryEmbedding(stock_rotary(torch.bfloat16), RopeOptions("fp32"), 64)(positions, query, key)
    assert not torch.equal(stock_query, fp32_query)  # the BF16 rounding the probe measures


@pytest.mark.parametrize("variant", ["cast", "fp32"])
def test_position_shift_equals_rotating_at_shifted_positions(vllm_context, variant):
    from evalkit.vllm_plugin.rope import RopeOptions, ServingRotaryEmbedding

    query, key = qk(torch.bfloat16)
    positions = torch.tensor([0, 1, 2, 3, 10, 30, 63])
    shifted = ServingRotaryEmbedding(stock_rotary(torch.bfloat16), RopeOptions(variant, 16), 64)
    unshifted = ServingRotaryEmbedding(stock_rotary(torch.bfloat16, 128), RopeOptions(variant, 0), 128)
    expected = unshifted(positions + 16, query.clone(), key.clone())
    for got, want in zip(shifted(positions, query.clone(), key.clone()), expected):
        assert torch.equal(got, want)


def test_install_replaces_only_what_options_or_the_window_need(vllm_context):
    from torch import nn

    from evalkit.vllm_plugin.rope import RopeOptions, ServingRotaryEmbedding, install_rope_options

    shared = stock_rotary(torch.float32)  # vLLM shares one rotary module between layers
    model = nn.ModuleList([nn.Module(), nn.Module()])
    for layer in model:
        layer.rotary_emb = shared
    assert install_rope_options(model, RopeOptions(), max_model_len=64) == 0
    assert model[0].rotary_emb is shared
    assert install_rope_options(model, RopeOptions(), max_model_len=100) == 1  # beyond the trained window
    assert isinstance(model[0].rotary_emb, ServingRotaryEmbedding) and model[0].rotary_emb is model[1].rotary_emb
    query, key = qk(torch.float32, tokens=2)
    model[0].rotary_emb(torch.tensor([98, 99]), query, key)  # positions past the original table


def test_rotaries_whose_table_depends_on_the_window_are_refused(vllm_context):
    from vllm.model_executor.layers.rotary_embedding.dynamic_ntk_scaling_rope import (
        DynamicNTKScalingRotaryEmbedding,
    )

    from evalkit.vllm_plugin.rope import RopeOptions, ServingRotaryEmbedding

    rotary = DynamicNTKScalingRotaryEmbedding(HEAD, ROT, 64, 64, BASE, True, 2.0, torch.float32)
    with pytest.raises(NotImplementedError, match="DynamicNTKScalingRotaryEmbedding"):
        ServingRotaryEmbedding(rotary, RopeOptions("fp32"), 64)
