"""`evalkit parity`: how close each engine's forward of a checkpoint, served as trained and stock
(models.precision serves), is to the trainer's own on the same tokens: the KL divergence of its
next-token distribution from the trainer's, and whether their top-1 tokens agree, per bucket of
positions (RoPE's rounding grows with the position). An engine serving a checkpoint stock, off the
regime it trained in, states its KL from a transformers twin in one line (engines.hf.off_regime_kl)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from evalkit.engines.hf import divergence, probe_tokens
from evalkit.errors import UserError
from evalkit.markdown import markdown_table

FIRST_BUCKET = 64  # positions 0-63, then doubling: 64-127, 128-255, ...


def measure(checkpoint: Path, engines: list[str], length: int) -> list[dict[str, Any]]:
    """Per engine and serving (trained, stock) and bucket of positions: how far the engine's forward
    is from the trainer's on `length` tokens of the built-in prose."""
    from evalkit.engines import engine_class, get_engine
    from evalkit.models.check import checkpoint_directory, load_tokenizer
    from evalkit.models.precision import SERVINGS, resolve_device
    from evalkit.models.refs import checkpoint_meta
    from evalkit.train.loop import trainer_logprobs

    for name in engines:
        engine_class(name)  # an unknown or uninstalled engine: one line before any model loads
    checkpoint = checkpoint_directory(checkpoint, "evalkit parity")
    if not checkpoint_meta(checkpoint).get("config"):
        raise UserError(
            f"{checkpoint}/meta.json records no training run: parity needs a checkpoint evalkit train wrote"
        )
    tokens = probe_tokens(load_tokenizer(checkpoint), length)
    if len(tokens) < length:
        raise UserError(f"the built-in prose gives {len(tokens)} tokens with this tokenizer; ask for fewer")
    reference = trainer_logprobs(checkpoint, tokens, resolve_device("auto"))
    rows = []
    for name in engines:
        for serving in SERVINGS:
            with get_engine(name, checkpoint, serving=serving, max_length=length) as engine:
                kl, top1 = divergence(reference, engine.position_logprobs(tokens))
                served = {"engine": name, "serving": serving, "served": engine.served.describe()}
            rows += [{**served, **row} for row in bucket_rows(kl, top1)]
    return rows


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


def parity_table(rows: list[dict[str, Any]]) -> str:
    header = ["engine", "serving", "served as", "positions", "KL mean (nats)", "KL max", "top-1 agreement"]
    cells = [
        [r["engine"], r["serving"], r["served"], r["positions"], f"{r['kl_mean']:.2e}", f"{r['kl_max']:.2e}",
         f"{100 * r['top1_agreement']:.1f}%"]
        for r in rows
    ]  # fmt: skip
    return markdown_table(header, cells)
