"""How close two forwards of one checkpoint are, position by position: the KL divergence of one's
next-token distribution from a reference's, and whether their top-1 tokens agree, per bucket of
positions (RoPE's rounding grows with the position). `evalkit parity` (probe.parity) holds each
engine's serving to the trainer's own forward; an engine serving a checkpoint stock, off the regime
it trained in, states its KL from a transformers twin served as trained in one line
(engines.hf.off_regime_kl)."""

from __future__ import annotations

from typing import Any

import torch

FIRST_BUCKET = 64  # positions 0-63, then doubling: 64-127, 128-255, ...


def probe_tokens(tokenizer, length: int) -> list[int]:
    """`length` tokens of the built-in prose (evalkit.corpus), after the BOS where the tokenizer has
    one: the same text for every engine and checkpoint of a tokenizer."""
    from evalkit.corpus.prose import prose_text

    bos = [] if tokenizer.bos_token_id is None else [int(tokenizer.bos_token_id)]
    ids = tokenizer(prose_text()[: 16 * length], add_special_tokens=False)["input_ids"]
    return (bos + list(ids))[:length]


def divergence(reference: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position of two [T, V] log-probability tensors: KL(reference ‖ other) in nats, and
    whether the two most likely tokens are the same."""
    probabilities = reference.exp()
    gap = torch.where(probabilities > 0, reference - other, torch.zeros_like(reference))
    return (probabilities * gap).sum(-1).clamp_min(0), reference.argmax(-1) == other.argmax(-1)


def bucket_rows(kl: torch.Tensor, top1: torch.Tensor) -> list[dict[str, Any]]:
    """Mean and largest KL and the top-1 agreement per bucket of positions (the position predicted
    from: row t is the distribution after tokens 0..t)."""
    rows, start, end = [], 0, FIRST_BUCKET
    while start < len(kl):
        end = min(end, len(kl))
        part = kl[start:end]
        rows.append(
            {
                "positions": f"{start}-{end - 1}",
                "kl_mean": float(part.mean()),
                "kl_max": float(part.max()),
                "top1_agreement": float(top1[start:end].float().mean()),
            }
        )
        start, end = end, 2 * end
    return rows
