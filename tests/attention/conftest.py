import random

import pytest
import torch

from evalkit.attention import Paradigm, pack

BOS, EOS = 1, 2


def random_pack(paradigm: Paradigm, seq_len: int, seed: int):
    """A window of random documents (lengths 1..seq_len/2, last one cut), tags when needed."""
    rng = random.Random(seed)
    docs, total = [], 0
    while total < seq_len + 8:  # more than fits: the last document is cut
        n = rng.randint(1, max(2, seq_len // 2))
        docs.append([rng.randint(10, 90) for _ in range(n)])
        total += n + 2
    tags = [rng.randint(91, 99) for _ in docs] if paradigm.uses_tags else None
    return pack(docs, seq_len, paradigm, bos_id=BOS, eos_id=EOS, domain_tags=tags, seed=seed)


@pytest.fixture
def make_pack():
    return random_pack


def naive_attention(q, k, v, mask, scale=None):
    """Textbook attention in float64 with an explicit bool mask [B, Sq, Sk] (GQA by repetition)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)
