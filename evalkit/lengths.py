"""Token counts as users write them: 4096, 4k, 16K, 128k (k = 1024)."""

from __future__ import annotations

from evalkit.errors import UserError


def parse_length(text: str) -> int:
    """'16k' -> 16384, '512' -> 512; a UserError for anything else."""
    raw = text.strip().lower()
    multiplier = 1024 if raw.endswith("k") else 1
    digits = raw[:-1] if multiplier > 1 else raw
    if not digits.isdigit() or int(digits) == 0:
        raise UserError(f"could not read length {text!r}: use a positive integer such as 4096 or 4k")
    return int(digits) * multiplier


def parse_lengths(text: str) -> list[int]:
    """A comma-separated list of lengths, e.g. '4k,8k,16384'."""
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise UserError("no lengths given: use a comma-separated list such as 4k,8k")
    return [parse_length(part) for part in parts]
