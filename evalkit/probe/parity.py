"""`evalkit parity`: each engine's next-token distributions against the trainer's own forward on
the same tokens, served as trained and stock (engines.parity measures; models.precision serves)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkit.engines.parity import bucket_rows, divergence, probe_tokens
from evalkit.errors import UserError
from evalkit.markdown import markdown_table


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


def parity_table(rows: list[dict[str, Any]]) -> str:
    header = ["engine", "serving", "served as", "positions", "KL mean (nats)", "KL max", "top-1 agreement"]
    cells = [
        [r["engine"], r["serving"], r["served"], r["positions"], f"{r['kl_mean']:.2e}", f"{r['kl_max']:.2e}",
         f"{100 * r['top1_agreement']:.1f}%"]
        for r in rows
    ]  # fmt: skip
    return markdown_table(header, cells)
