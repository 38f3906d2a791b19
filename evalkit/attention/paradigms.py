"""The attention paradigms of the paper (shared/paper.md section 2) and what each one implies.

Every other module asks a `Paradigm` what it needs (own BOS per document? shared anchor?
document mask? position reset? interleaving? tags?) instead of testing names, so a new
paradigm is one member: its name and its traits.
"""

from __future__ import annotations

import enum

from evalkit.arglists import parse_list
from evalkit.errors import UserError

TRAITS = ("has_anchor", "masks_documents", "resets_positions", "interleaves", "uses_tags")


class Paradigm(str, enum.Enum):
    """A paradigm's name, then the traits it has (one row each below; no module tests names)."""

    has_anchor: bool  # one shared BOS at token 0 that every document attends to; documents carry no BOS
    masks_documents: bool  # attention is restricted to the query's own document (plus the anchor, if any)
    resets_positions: bool
    interleaves: bool
    uses_tags: bool

    def __new__(cls, value: str, *traits: str) -> Paradigm:
        member = str.__new__(cls, value)
        member._value_ = value
        if unknown := set(traits) - set(TRAITS):  # a misspelt trait would read as False everywhere
            raise TypeError(f"paradigm {value!r}: unknown traits {sorted(unknown)}")
        for trait in TRAITS:
            setattr(member, trait, trait in traits)
        return member

    FULL = "full"
    INTRA_DOC = "intra_doc", "masks_documents"
    INTRA_DOC_RESET = "intra_doc_reset", "masks_documents", "resets_positions"
    ANCHOR = "anchor", "has_anchor", "masks_documents"
    ANCHOR_TAG = "anchor_tag", "has_anchor", "masks_documents", "uses_tags"
    INTRA_DOC_INTERLEAVED = "intra_doc_interleaved", "masks_documents", "interleaves"
    ANCHOR_INTERLEAVED = "anchor_interleaved", "has_anchor", "masks_documents", "interleaves"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, name: str | Paradigm) -> Paradigm:
        """The paradigm called `name`; a ValueError listing the valid names otherwise."""
        if isinstance(name, Paradigm):
            return name
        try:
            return cls(name)
        except ValueError:
            valid = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown paradigm {name!r}; choose one of: {valid}") from None


def parse_paradigms(text: str) -> list[Paradigm]:
    """Paradigm names, comma-separated (--paradigms); a misspelt one is a one-line error naming the valid ones."""
    try:
        return parse_list(text, Paradigm.parse)
    except ValueError as err:
        raise UserError(str(err)) from None
