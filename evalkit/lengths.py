"""Token counts as users write them: 4096, 4k, 16K, 128k (k = 1024)."""

from __future__ import annotations

import re

from evalkit.arglists import parse_list
from evalkit.errors import UserError

# ASCII digits only: str.isdigit() also accepts '²' or '١', which int() then refuses or reads
# unexpectedly; nine digits keep int() far from its digit limit (and lengths far beyond any model).
_LENGTH = re.compile(r"([0-9]{1,9})(k?)")


def parse_length(text: str) -> int:
    """'16k' -> 16384, '512' -> 512; a UserError for anything else."""
    match = _LENGTH.fullmatch(text.strip().lower())
    if match is None or int(match.group(1)) == 0:
        raise UserError(f"could not read length {text!r}: use a positive integer such as 4096 or 4k")
    return int(match.group(1)) * (1024 if match.group(2) else 1)


def parse_lengths(text: str) -> list[int]:
    """A comma-separated list of lengths, e.g. '4k,8k,16384', each once (4k,4096 is one length)."""
    lengths = parse_list(text, parse_length)
    if not lengths:
        raise UserError(f"no lengths given ({text!r}): use a comma-separated list such as 4k,8k")
    return lengths
