"""How a request tells the plugin it is packed: its prompt laid out by engines.tokens.packed_layout,
its sampling parameters carry the segment lengths (no marker token in the prompt: the model sees
exactly the tokens and positions training used); without the key a request is plain:

    SamplingParams(..., extra_args={"evalkit_packed": {"anchor_length": 1, "document_lengths": [12, 40, 7]}})
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EXTRA_ARGS_KEY = "evalkit_packed"


@dataclass(frozen=True)
class PackedSegments:
    """The anchor and document lengths of one packed request, in tokens."""

    anchor_length: int
    document_lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.anchor_length < 1:
            raise ValueError(f"a packed request needs an anchor of at least one token, got {self.anchor_length}")
        if not self.document_lengths or min(self.document_lengths) < 1:
            raise ValueError("a packed request needs at least one document, and no document may be empty")

    def extra_args(self) -> dict[str, Any]:
        """What to put in SamplingParams.extra_args to send this layout with a request."""
        return {EXTRA_ARGS_KEY: {"anchor_length": self.anchor_length, "document_lengths": list(self.document_lengths)}}

    def cache_salt(self) -> str:
        """A prefix-cache salt: a packed request's K/V (beyond the first layer) differ from a plain
        request's over the same tokens, so blocks of one layout are never reused by another."""
        lengths = ",".join(map(str, self.document_lengths))
        return f"evalkit-packed:{self.anchor_length}:{lengths}"


def segments_from_doc_ids(doc_ids: Sequence[int]) -> PackedSegments:
    """The segments of a packed layout's document part given as doc ids (0 anchor, then 1, 2, ...)."""
    lengths = [len(list(run)) for _, run in itertools.groupby(doc_ids)]
    if not doc_ids or doc_ids[0] != 0:
        raise ValueError("packed doc ids start with the anchor (doc id 0)")
    return PackedSegments(anchor_length=lengths[0], document_lengths=tuple(lengths[1:]))


def segments_from_extra_args(extra_args: Mapping[str, Any] | None) -> PackedSegments | None:
    """The layout a request carries, None for a plain request; a ValueError for a malformed one."""
    if not extra_args or EXTRA_ARGS_KEY not in extra_args:
        return None
    spec = extra_args[EXTRA_ARGS_KEY]
    if not isinstance(spec, Mapping) or set(spec) != {"anchor_length", "document_lengths"}:
        raise ValueError(
            f"extra_args[{EXTRA_ARGS_KEY!r}] must be {{'anchor_length': int, 'document_lengths': [int, ...]}}"
        )
    lengths = spec["document_lengths"]
    if not isinstance(lengths, Sequence) or not all(isinstance(n, int) for n in lengths):
        raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}]['document_lengths'] must be a list of integers")
    if not isinstance(spec["anchor_length"], int):
        # ValueError, not TypeError: vLLM turns a ValueError from validate_params into a request error.
        raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}]['anchor_length'] must be an integer")  # noqa: TRY004
    return PackedSegments(anchor_length=spec["anchor_length"], document_lengths=tuple(lengths))
