"""The anchor token: the one rule shared by training (the anchor paradigms' token 0), serving
(`--encoding anchor`) and every prompt (the token that conditions a text's first token)."""

from __future__ import annotations

from evalkit.errors import UserError


def anchor_token_id(tokenizer) -> int:
    """BOS, or EOS where the tokenizer has no BOS (as the paper does for Qwen). At inference a
    prompt is [anchor] + text at positions 0..n: what the anchor paradigms train."""
    token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if token is None:
        raise UserError("the tokenizer has neither a BOS nor an EOS token; evalkit needs one to condition on")
    return int(token)


def anchor_record(tokenizer) -> dict:
    """Which token is the anchor and why, as every summary, engine info and checkpoint that uses
    an anchor records it: it changes what is measured, so it is never left implicit."""
    token_id = anchor_token_id(tokenizer)
    why = "BOS" if tokenizer.bos_token_id is not None else "EOS: the tokenizer has no BOS"
    return {"id": token_id, "token": tokenizer.convert_ids_to_tokens(token_id), "why": why}


def anchor_note(tokenizer) -> str:
    """The one line a command prints to stderr where it uses an anchor."""
    anchor = anchor_record(tokenizer)
    return f"note: the anchor token is {anchor['token']!r} (id {anchor['id']}, {anchor['why']})"
