"""The attention paradigms of the paper (shared/paper.md section 2) and what each one implies.

Every other module asks a `Paradigm` what it needs (own BOS per document? shared anchor?
document mask? position reset? interleaving? tags?) instead of testing names, so a new
paradigm is one row in `_TRAITS`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Paradigm(str, enum.Enum):
    FULL = "full"
    INTRA_DOC = "intra_doc"
    INTRA_DOC_RESET = "intra_doc_reset"
    ANCHOR = "anchor"
    ANCHOR_TAG = "anchor_tag"
    INTRA_DOC_INTERLEAVED = "intra_doc_interleaved"
    ANCHOR_INTERLEAVED = "anchor_interleaved"

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

    @property
    def has_anchor(self) -> bool:
        """One shared BOS at token 0 that every document attends to; documents carry no BOS."""
        return _TRAITS[self].anchor

    @property
    def masks_documents(self) -> bool:
        """Attention is restricted to the query's own document (plus the anchor, if any)."""
        return _TRAITS[self].document_mask

    @property
    def resets_positions(self) -> bool:
        return _TRAITS[self].reset_positions

    @property
    def interleaves(self) -> bool:
        return _TRAITS[self].interleave

    @property
    def uses_tags(self) -> bool:
        return _TRAITS[self].tags


@dataclass(frozen=True)
class ParadigmTraits:
    anchor: bool
    document_mask: bool
    reset_positions: bool = False
    interleave: bool = False
    tags: bool = False


_TRAITS: dict[Paradigm, ParadigmTraits] = {
    Paradigm.FULL: ParadigmTraits(anchor=False, document_mask=False),
    Paradigm.INTRA_DOC: ParadigmTraits(anchor=False, document_mask=True),
    Paradigm.INTRA_DOC_RESET: ParadigmTraits(anchor=False, document_mask=True, reset_positions=True),
    Paradigm.ANCHOR: ParadigmTraits(anchor=True, document_mask=True),
    Paradigm.ANCHOR_TAG: ParadigmTraits(anchor=True, document_mask=True, tags=True),
    Paradigm.INTRA_DOC_INTERLEAVED: ParadigmTraits(anchor=False, document_mask=True, interleave=True),
    Paradigm.ANCHOR_INTERLEAVED: ParadigmTraits(anchor=True, document_mask=True, interleave=True),
}


def parse_paradigms(text: str) -> list[Paradigm]:
    """Paradigm names, comma-separated (--paradigms); a misspelt one is a one-line error naming the valid ones."""
    from evalkit.arglists import parse_list
    from evalkit.errors import UserError

    try:
        return parse_list(text, Paradigm.parse)
    except ValueError as err:
        raise UserError(str(err)) from None
