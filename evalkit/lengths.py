"""Token counts as users write them: 4096, 4k, 16K, 128k (k = 1024)."""

from __future__ import annotations

import re

from evalkit.arglists import parse_list
from evalkit.errors import UserError

# ASCII digits only: str.isdigit() also accepts '²' or '١', which int() then refuses or reads
# unexpectedly.
_LENGTH = re.compile(r"([0-9]+)(k?)")
MAX_LENGTH = 999_999_999  # tokens: far beyond any model's window, and int() far from its digit limit


def parse_length(text: str) -> int:
    """'16k' -> 16384, '512' -> 512; a UserError for anything else."""
    match = _LENGTH.fullmatch(text.strip().lower())
    digits, k = (match.group(1).lstrip("0"), match.group(2)) if match else ("", "")
    if not digits:
        raise UserError(f"could not read length {text!r}: use a positive integer such as 4096 or 4k")
    # Digits counted before int(): a thousand-digit number is refused without being converted.
    if len(digits) > len(str(MAX_LENGTH)) or int(digits) * (1024 if k else 1) > MAX_LENGTH:
        raise LengthBeyondLimit(text)
    return int(digits) * (1024 if k else 1)


class LengthBeyondLimit(UserError):
    """A length no model's window reaches. A command that knows the model says its window instead."""

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(
            f"length {text!r} is above evalkit's limit of {MAX_LENGTH} tokens, beyond any model's window: give "
            "lengths within the model's window (its config.json max_position_embeddings), or up to --max-length"
        )


MIN_WINDOW = 2  # tokens: one of prompt (a BOS at least) and one generated or scored


def check_max_length(value: int | None, option: str = "--max-length") -> None:
    """The one bound of a window setting, for every place that takes one (the pipeline's request
    check, an engine built from Python): at least a prompt token and a generated one."""
    if value is not None and value < MIN_WINDOW:
        raise UserError(
            f"{option} must be at least {MIN_WINDOW} tokens (a prompt token and a generated one), got {value}"
        )


def length_label(length: int) -> str:
    """The label of a length in tables and plots: 4096 -> '4K', 1000 -> '1000' (k = 1024, as parsed)."""
    return f"{length // 1024}K" if length % 1024 == 0 else str(length)


def parse_lengths(text: str) -> list[int]:
    """A comma-separated list of lengths, e.g. '4k,8k,16384', each once (4k,4096 is one length)."""
    lengths = parse_list(text, parse_length)
    if not lengths:
        raise UserError(f"no lengths given ({text!r}): use a comma-separated list such as 4k,8k")
    return lengths
