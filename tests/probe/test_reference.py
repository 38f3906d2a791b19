"""D and D_logit against a computation written out by hand, independent of the probe attention.

The reference runs the model once per shift with transformers' own eager attention, captures
each layer's q_proj and k_proj outputs with hooks, applies RoPE by hand the way transformers
does (cos/sin in FP32, cast to the activation dtype), and loops over layers, heads and key
columns with explicit causal softmaxes.
"""

import pytest
import torch

DELTA2 = 16


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_by_hand(x_TD, positions, theta: float, dtype):
    head_dim = x_TD.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    return x_TD * cos + rotate_half(x_TD) * sin


def attention_by_hand(model, token_ids, shift: int):
    """Per layer and head: (logits [T, T] as the softmax sees them, probabilities [T, T])."""
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    captured = {}
    hooks = []
    for index, layer in enumerate(model.layers):
        for name in ("q_proj", "k_proj"):
            module = getattr(layer.self_attn, name)
            hooks.append(
                module.register_forward_hook(
                    lambda _m, _i, out, key=(index, name): captured.__setitem__(key, out[0].detach())
                )
            )
    seq_len = token_ids.numel()
    positions = torch.arange(seq_len) + shift
    with torch.no_grad():
        model(input_ids=token_ids[None], position_ids=positions[None])
    for hook in hooks:
        hook.remove()

    dtype = model.dtype
    theta = config.rope_parameters["rope_theta"]
    maps = []
    for index in range(config.num_hidden_layers):
        q = captured[(index, "q_proj")].view(seq_len, heads, head_dim)
        k = captured[(index, "k_proj")].view(seq_len, kv_heads, head_dim)
        layer_maps = []
        for head in range(heads):
            q_h = rope_by_hand(q[:, head], positions, theta, dtype)
            k_h = rope_by_hand(k[:, head // (heads // kv_heads)], positions, theta, dtype)
            logits = (q_h @ k_h.T) * head_dim**-0.5
            probs = torch.zeros(seq_len, seq_len, dtype=torch.float32)
            for i in range(seq_len):
                probs[i, : i + 1] = torch.softmax(logits[i, : i + 1].float(), dim=-1).to(dtype).float()
            layer_maps.append((logits.float(), probs))
        maps.append(layer_maps)
    return maps


def differences_by_hand(model, token_ids, delta1: int):
    seq_len = token_ids.numel()
    first, second = attention_by_hand(model, token_ids, delta1), attention_by_hand(model, token_ids, DELTA2)
    columns = torch.zeros(seq_len, dtype=torch.float64)
    logit_first = 0.0
    for layer_a, layer_b in zip(first, second):
        for (logits_a, probs_a), (logits_b, probs_b) in zip(layer_a, layer_b):
            for j in range(seq_len):
                n_j = 1.0 / (seq_len - j)  # 1 / (T − j + 1) for the 1-based column j + 1
                columns[j] += n_j * float((probs_a[:, j] - probs_b[:, j]).abs().sum())
            logit_first += float((logits_a[:, 0] - logits_b[:, 0]).abs().sum())
    return columns, logit_first / seq_len


@pytest.mark.parametrize("delta1", [0, 3])
def test_probe_matches_the_hand_computation(tiny_llama, texts, delta1):
    from evalkit.probe import measure_shifts

    model = tiny_llama(torch.bfloat16)
    (found,) = measure_shifts(model, texts[:1], [delta1], DELTA2)
    model.set_attn_implementation("eager")  # the reference uses transformers' own attention
    columns, logit_first = differences_by_hand(model, texts[0], delta1)
    assert float(columns.sum()) > 1e-3  # BF16: a difference worth comparing
    assert found.total == pytest.approx(float(columns.sum()), rel=1e-5)
    assert found.logit_first == pytest.approx(logit_first, rel=1e-5)
    torch.testing.assert_close(found.columns, columns, rtol=1e-5, atol=1e-9)
