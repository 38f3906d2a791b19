"""The probe's numbers on a tiny Llama: RoPE's promise in FP32, its breakage in BF16, exact zeros."""

import pytest
import torch

from evalkit.attention.hf import rotary_modules
from evalkit.probe import measure_shifts, rope_precision

DTYPES = [torch.float32, torch.bfloat16]


def test_fp32_keeps_ropes_promise_and_bf16_breaks_it(tiny_llama, texts):
    fp32 = measure_shifts(tiny_llama(torch.float32), texts, [0, 5, 100], 16)
    bf16 = measure_shifts(tiny_llama(torch.bfloat16), texts, [0, 5, 100], 16)
    for full, low in zip(fp32, bf16):
        assert full.total < 1e-5
        assert low.total > 1000 * full.total
        assert low.logit_first > 100 * full.logit_first


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rope", ["cast", "fp32"])
def test_equal_shifts_differ_by_exactly_zero(tiny_llama, texts, dtype, rope):
    (same,) = measure_shifts(tiny_llama(dtype), texts, [16], 16, rope=rope)
    assert same.total == 0.0
    assert same.logit_first == 0.0
    assert bool((same.columns == 0).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_columns_sum_to_the_total(tiny_llama, texts, dtype):
    for found in measure_shifts(tiny_llama(dtype), texts, [0, 7], 16):
        assert found.columns.shape == (texts.shape[1],)
        assert float(found.columns.sum()) == pytest.approx(found.total, rel=1e-12)
        assert found.first_token_share == pytest.approx(float(found.columns[0]) / found.total, rel=1e-12)


def test_fp32_rope_changes_bf16_and_matches_cast_in_fp32(tiny_llama, texts):
    bf16 = tiny_llama(torch.bfloat16)
    cast_low, fp32_low = (measure_shifts(bf16, texts, [0], 16, rope=rope)[0] for rope in ("cast", "fp32"))
    assert cast_low.total != fp32_low.total
    assert fp32_low.total > 0
    full = tiny_llama(torch.float32)
    cast_full, fp32_full = (measure_shifts(full, texts, [0], 16, rope=rope)[0] for rope in ("cast", "fp32"))
    assert fp32_full.total == pytest.approx(cast_full.total, rel=1e-6, abs=1e-9)
    assert torch.allclose(fp32_full.columns, cast_full.columns, rtol=1e-6, atol=1e-12)


def test_rope_variant_is_restored_on_exit(tiny_llama, texts):
    model = tiny_llama(torch.bfloat16)
    (rotary,) = rotary_modules(model)
    before = model(input_ids=texts).last_hidden_state
    with rope_precision(model, "fp32"):
        cos, _sin = rotary(before, torch.arange(4)[None])
        assert cos.dtype == torch.float32  # every layer's rotation now runs on FP32 tables
        during = model(input_ids=texts).last_hidden_state
    assert not rotary._forward_pre_hooks and not rotary._forward_hooks
    after = model(input_ids=texts).last_hidden_state
    assert torch.equal(before, after)
    assert not torch.equal(before, during)


@pytest.mark.parametrize("dtype", DTYPES)
def test_probe_attention_returns_what_eager_attention_returns(tiny_llama, texts, dtype):
    model = tiny_llama(dtype)
    probed = model(input_ids=texts).last_hidden_state
    model.set_attn_implementation("eager")
    eager = model(input_ids=texts).last_hidden_state
    torch.testing.assert_close(probed, eager, rtol=0, atol=1e-6 if dtype == torch.float32 else 2e-2)


def test_batching_and_row_blocks_do_not_change_the_numbers(tiny_llama, texts):
    model = tiny_llama(torch.bfloat16)
    one = measure_shifts(model, texts, [0, 5, 100], 16, shifts_per_batch=1)
    blocked = measure_shifts(model, texts, [0, 5, 100], 16, shifts_per_batch=3, block_elements=4 * 4 * 5 * 48)
    for a, b in zip(one, blocked):
        assert b.total == pytest.approx(a.total, rel=1e-3)
        assert b.logit_first == pytest.approx(a.logit_first, rel=1e-3)


def test_a_model_without_the_probe_attention_is_refused(tiny_llama, texts):
    model = tiny_llama(torch.float32)
    model.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="attn_implementation"):
        measure_shifts(model, texts, [0], 16)
