"""The hf engine's plain attention: SDPA whose grouped-query decoding reads each key-value head once."""

import pytest
import torch

from evalkit.attention.hf import _grouped_sdpa_forward, register_grouped_sdpa
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)


class Module(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def reference(query, key, value, keep, scale):
    """Each query head over its own copy of its key-value head, padding columns masked, in float64."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = (query.double() @ key.double().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ value.double()).transpose(1, 2)


@pytest.mark.parametrize("kv_heads, groups", [(3, 3), (2, 4), (4, 1)])
def test_one_query_per_row_matches_repeated_heads_under_a_padding_mask(kv_heads, groups):
    torch.manual_seed(0)
    batch, columns, head_dim = 3, 37, 16
    query = torch.randn(batch, kv_heads * groups, 1, head_dim)
    key, value = torch.randn(2, batch, kv_heads, columns, head_dim).unbind(0)
    keep = torch.ones(batch, columns, dtype=torch.bool)
    keep[1, :5], keep[2, :20] = False, False  # left padding of different widths
    out, _ = _grouped_sdpa_forward(Module(groups), query, key, value, keep[:, None, None, :], scaling=0.25)
    assert out.shape == (batch, 1, kv_heads * groups, head_dim)
    torch.testing.assert_close(out.double(), reference(query, key, value, keep, 0.25), atol=1e-5, rtol=1e-5)


def test_prefill_and_unmasked_calls_are_transformers_own_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(1)
    module = Module(3)
    query, key, value = torch.randn(1, 6, 9, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    ours, _ = _grouped_sdpa_forward(module, query, key, value, None, scaling=0.3)
    theirs, _ = sdpa_attention_forward(module, query, key, value, None, scaling=0.3)
    assert torch.equal(ours, theirs)


def test_registered_under_its_name_with_sdpa_masks():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    name = register_grouped_sdpa()
    assert AttentionInterface()[name] is _grouped_sdpa_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS[name] is sdpa_mask
