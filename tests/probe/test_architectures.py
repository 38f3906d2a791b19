"""The probe on unmodified transformers Qwen2, Mistral and Gemma 3 models (grouped-query heads, sliding layers)."""

import pytest
import torch
from transformers import Gemma3TextConfig, MistralConfig, Qwen2Config

from evalkit.probe import measure_shifts
from evalkit.probe.run import attention_window
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


def test_the_probe_goes_up_to_the_context_whatever_the_sliding_layers():
    assert attention_window(MistralConfig(sliding_window=32, max_position_embeddings=128)) == 128
    assert attention_window(Gemma3TextConfig(sliding_window=32, max_position_embeddings=512)) == 512
    assert attention_window(Qwen2Config(max_position_embeddings=512)) == 512


WINDOW = 12
GEMMA3 = dict(SMALL, num_hidden_layers=3, head_dim=16, sliding_window=WINDOW,
              layer_types=["sliding_attention", "full_attention", "sliding_attention"])  # fmt: skip


def eager_distance(model, texts, delta1: int, delta2: int) -> dict[str, float]:
    """D (Eq. 4) per layer type from transformers' eager attention maps (its own sliding mask),
    summed here from the definition: Σ_(l,h) Σ_j n_j Σ_i |P_ij(Δ1) − P_ij(Δ2)|, n_j = 1/(T − j)."""
    model.set_attn_implementation("eager")
    seq = texts.shape[1]
    maps = {}
    for delta in (delta1, delta2):
        positions = torch.arange(seq)[None].expand(texts.shape[0], -1) + delta
        maps[delta] = model(input_ids=texts, position_ids=positions, output_attentions=True).attentions
    model.set_attn_implementation("evalkit_probe")
    n = 1.0 / torch.arange(seq, 0, -1, dtype=torch.float64)
    totals = {}
    for layer, kind in enumerate(model.config.layer_types):
        diff = (maps[delta1][layer].double() - maps[delta2][layer].double()).abs()  # [N, H, T, T]
        per_text = (diff.sum(dim=(1, 2)) * n).sum(dim=-1)
        totals[kind] = totals.get(kind, 0.0) + float(per_text.mean())
    return totals


def test_on_a_sliding_window_model_each_layer_is_measured_within_its_window(texts):
    """Gemma 3 with sliding and global layers: the probe's outputs are eager attention's (with the
    model's own sliding mask), and its sums per layer type are those of eager attention's maps."""
    from evalkit.probe.run import measurement_rows

    model = build(Gemma3TextConfig(**GEMMA3), torch.bfloat16)
    probed = model(input_ids=texts).last_hidden_state
    model.set_attn_implementation("eager")
    torch.testing.assert_close(probed, model(input_ids=texts).last_hidden_state, rtol=0, atol=2e-2)
    model.set_attn_implementation("evalkit_probe")

    (found,) = measure_shifts(model, texts, [16], 0)
    expected = eager_distance(model, texts, 16, 0)
    by_type = {kind: float(values.mean()) for kind, values in found.per_text_total_by_type.items()}
    assert sorted(by_type) == ["full_attention", "sliding_attention"]
    for kind, value in expected.items():
        assert by_type[kind] == pytest.approx(value, rel=1e-3), kind
    assert found.total == pytest.approx(sum(by_type.values()), rel=1e-9)
    rows = measurement_rows("shift", found, "pretrained", "bf16", "cast")
    layer_rows = {(r["metric"], r["layer_type"]) for r in rows if "layer_type" in r}
    assert ("attn_diff_layer_type", "sliding_attention") in layer_rows and len(layer_rows) == 4
    (rotated_in_fp32,) = measure_shifts(model, texts, [16], 0, rope="fp32")  # both RoPE bases' tables in FP32
    assert rotated_in_fp32.total > 0 and set(rotated_in_fp32.per_text_total_by_type) == set(by_type)


def test_a_mistral_window_is_applied_in_every_layer(texts):
    model = build(MistralConfig(**SMALL, sliding_window=WINDOW), torch.float32)
    probed = model(input_ids=texts).last_hidden_state
    model.set_attn_implementation("eager")
    torch.testing.assert_close(probed, model(input_ids=texts).last_hidden_state, rtol=0, atol=1e-5)


def test_a_model_whose_attention_the_probe_cannot_reproduce_is_refused_before_any_work(tmp_path):
    from transformers import AutoModelForCausalLM, Gemma2Config

    from evalkit.errors import UserError
    from evalkit.probe.run import run_probe

    config = Gemma2Config(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
                          num_key_value_heads=1, head_dim=32, intermediate_size=64)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "gemma2")
    with pytest.raises(UserError, match=r"evalkit probe cannot reproduce .* soft-capping"):
        run_probe("shift", tmp_path / "gemma2", tmp_path / "out")
    assert not (tmp_path / "out").exists()
