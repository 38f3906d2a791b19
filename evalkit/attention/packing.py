"""`pack`: lay documents into one training window as a paradigm asks (shared/paper.md section 2).

A window holds whole documents and, at its end, the head of a cut document whose rest is
returned as `leftover` for the next window. Layout per paradigm:

    full / intra_doc / intra_doc_reset / intra_doc_interleaved:  [BOS d1 EOS][BOS d2 EOS]...
    anchor / anchor_interleaved:                          BOS  [d1 EOS][d2 EOS]...   (BOS = anchor)
    anchor_tag:                                           BOS  [T1 d1 EOS][T2 d2 EOS]...

A continued document (the leftover of a cut) keeps its domain tag, so every document piece in
an anchor_tag window is tagged; where it opens the next window, `window_start` decides its BOS
(docs/training.md's "Window start": "bos", the default, or "document").
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from evalkit.attention.paradigms import Paradigm

ANCHOR_DOC_ID = 0  # doc_ids value of the shared anchor token; documents are numbered from 1
PAD_DOC_ID = -1  # doc_ids value of padding at the end of a window that ran out of documents

# Interleaving as in the paper's reference code: documents of 64-2048 tokens are cut into 2 or 3
# chunks, split points uniform in [0.2, 0.8] of the length, at least 12 tokens apart.
INTERLEAVE_MIN_LEN, INTERLEAVE_MAX_LEN = 64, 2048
INTERLEAVE_SPLIT_RANGE = (0.2, 0.8)
INTERLEAVE_MIN_GAP = 12

WINDOW_STARTS = ("bos", "document")  # what opens a window that continues a cut document; see above


@dataclass
class Document:
    """Content token ids of one document (no special tokens), with what packing needs to know."""

    tokens: list[int]
    tag: int | None = None  # domain-tag token id, required by anchor_tag
    continued: bool = False  # the rest of a document cut at the end of an earlier window


@dataclass
class PackedSequence:
    """One window of exactly `len(input_ids)` tokens; all tensors are 1-D and aligned.

    loss_mask[i] is True when input_ids[i] is a training target predicted from position i-1, by
    one rule for every paradigm so that runs compare fairly (`pack` states it).
    """

    input_ids: torch.Tensor  # long [S]
    position_ids: torch.Tensor  # long [S]
    doc_ids: torch.Tensor  # long [S]: ANCHOR_DOC_ID, PAD_DOC_ID, or 1.. per document piece
    loss_mask: torch.Tensor  # bool [S]
    paradigm: Paradigm
    leftover: Document | None = None  # rest of the cut last document, to start the next window
    num_consumed: int = 0  # how many input documents the window used (wholly or in part)
    doc_lengths: list[int] = field(default_factory=list)  # tokens per document piece, by doc id

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.numel())

    def attention_doc_ids(self) -> torch.Tensor | None:
        """What the attention kernels take: document ids, or None for plain causal attention."""
        return self.doc_ids if self.paradigm.masks_documents else None


@dataclass
class _Piece:
    """The tokens one document contributes to this window, with its specials."""

    token_ids: list[int]
    prefix_len: int  # tag and/or BOS at its start: tokens of no document, never targets


def _as_documents(docs: Sequence[Sequence[int] | Document], domain_tags: Sequence[int] | None) -> list[Document]:
    if domain_tags is not None and len(domain_tags) != len(docs):
        raise ValueError(f"domain_tags has {len(domain_tags)} entries for {len(docs)} documents")
    tags = [None] * len(docs) if domain_tags is None else [int(tag) for tag in domain_tags]
    return [doc if isinstance(doc, Document) else Document([int(t) for t in doc], tag) for doc, tag in zip(docs, tags)]


def _piece(doc: Document, paradigm: Paradigm, bos_id: int, eos_id: int, opens_bos_window: bool) -> _Piece:
    """`doc` with its specials; `opens_bos_window`: it is the first piece of a window_start="bos" window."""
    prefix = []
    if paradigm.uses_tags:
        if doc.tag is None:
            raise ValueError(f"paradigm {paradigm} needs a domain tag for every document (pass domain_tags=)")
        prefix.append(doc.tag)
    if not paradigm.has_anchor and (not doc.continued or opens_bos_window):
        prefix.append(bos_id)
    return _Piece(prefix + list(doc.tokens) + [eos_id], len(prefix))


def _fill_window(
    docs: list[Document], room: int, paradigm: Paradigm, bos_id: int, eos_id: int, window_start: str
) -> tuple[list[_Piece], Document | None, int]:
    """Whole pieces while they fit, then the head of the next one; returns (pieces, leftover, consumed)."""
    pieces: list[_Piece] = []
    for consumed, doc in enumerate(docs):
        if not doc.tokens:
            continue
        piece = _piece(doc, paradigm, bos_id, eos_id, opens_bos_window=window_start == "bos" and not pieces)
        token_ids, prefix_len = piece.token_ids, piece.prefix_len
        if len(token_ids) <= room:
            pieces.append(piece)
            room -= len(token_ids)
            if room == 0:
                return pieces, None, consumed + 1
            continue
        if room < prefix_len + 1:  # not even one content token fits: the rest of the window is padding
            return pieces, None, consumed
        pieces.append(_Piece(token_ids[:room], prefix_len))
        rest = doc.tokens[room - prefix_len :]  # the content tokens that did not fit
        # When only the EOS was cut, the document is complete: nothing is carried.
        leftover = Document(tokens=list(rest), tag=doc.tag, continued=True) if rest else None
        return pieces, leftover, consumed + 1
    return pieces, None, len(docs)


def _split_points(length: int, rng: random.Random) -> list[int]:
    """Cut points for one document to interleave (empty when it stays whole)."""
    if not INTERLEAVE_MIN_LEN <= length <= INTERLEAVE_MAX_LEN:
        return []
    lo, hi = (math.ceil(f * length) for f in INTERLEAVE_SPLIT_RANGE)
    num_chunks = rng.choice((2, 3))
    for _ in range(100):
        points = sorted(rng.randint(lo, hi) for _ in range(num_chunks - 1))
        if all(b - a >= INTERLEAVE_MIN_GAP for a, b in zip(points, points[1:])):
            return points
    return [rng.randint(lo, hi)]  # three chunks did not fit the spacing rule: two instead


def _interleave(pieces: list[_Piece], rng: random.Random) -> list[tuple[int, list[int], int]]:
    """Chunks as (piece index, token ids, offset in piece), in interleaved order.

    Chunk k of document d gets the key r_d + k * exp(u_d) with r_d, u_d ~ U(0, 1): sorting by it
    mixes documents while each document's chunks keep their order (the reference code's rule).
    """
    keyed = []
    for d, piece in enumerate(pieces):
        bounds = [0, *_split_points(len(piece.token_ids), rng), len(piece.token_ids)]
        r, u = rng.random(), rng.random()
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            keyed.append((r + k * math.exp(u), d, piece.token_ids[a:b], a))
    keyed.sort(key=lambda item: (item[0], item[1]))
    return [(d, ids, offset) for _, d, ids, offset in keyed]


def pack(
    docs: Sequence[Sequence[int] | Document],
    seq_len: int,
    paradigm: Paradigm | str,
    *,
    bos_id: int,
    eos_id: int,
    domain_tags: Sequence[int] | None = None,
    seed: int = 0,
    window_start: str = "bos",
) -> PackedSequence:
    """Lay `docs` into one window of exactly `seq_len` tokens as `paradigm` prescribes.

    docs: token-id lists without special tokens, or `Document`s (e.g. an earlier leftover).
    domain_tags: one tag token id per document (anchor_tag). seed: the interleaving draw; a data
    loader passes a different seed per window. Padding (eos_id, PAD_DOC_ID, no loss) fills the
    end only when the documents run out. window_start: "bos" or "document" (module docstring).
    loss_mask: docs/training.md's one rule of trained targets, for every paradigm and window_start.
    """
    paradigm = Paradigm.parse(paradigm)
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    if window_start not in WINDOW_STARTS:
        raise ValueError(f"window_start must be one of {', '.join(WINDOW_STARTS)}, got {window_start!r}")
    documents = _as_documents(docs, domain_tags)

    anchor = paradigm.has_anchor  # the window opens with the anchor, at position 0
    ids: list[int] = [bos_id] if anchor else []
    doc_ids: list[int] = [ANCHOR_DOC_ID] if anchor else []
    positions: list[int] = [0] if anchor else []

    pieces, leftover, consumed = _fill_window(documents, seq_len - len(ids), paradigm, bos_id, eos_id, window_start)
    if paradigm.interleaves:
        # The first chunk is always some piece's chunk 0 (key r_d < 1 <= any later chunk's key), and
        # under "bos" every chunk 0 starts with a BOS: the window opens with one at position 0.
        chunks = _interleave(pieces, random.Random(seed))
    else:
        chunks = [(d, piece.token_ids, 0) for d, piece in enumerate(pieces)]

    in_doc = [0] * len(ids)  # per token: its piece's doc id for content and EOS, 0 for any other
    for d, chunk_ids, offset in chunks:
        # Reset restarts each document at 0; every other paradigm counts window positions.
        start = offset if paradigm.resets_positions else len(ids)
        in_doc.extend(0 if offset + k < pieces[d].prefix_len else d + 1 for k in range(len(chunk_ids)))
        ids.extend(chunk_ids)
        doc_ids.extend([d + 1] * len(chunk_ids))
        positions.extend(range(start, start + len(chunk_ids)))

    num_pad = seq_len - len(ids)
    start = 0 if paradigm.resets_positions else len(ids)
    ids.extend([eos_id] * num_pad)
    doc_ids.extend([PAD_DOC_ID] * num_pad)
    positions.extend(range(start, start + num_pad))

    # The docstring's rule: a target and its predictor (the token before it) are in one piece.
    in_doc_tensor = torch.tensor(in_doc + [0] * num_pad, dtype=torch.long)
    loss_mask = torch.zeros(seq_len, dtype=torch.bool)
    loss_mask[1:] = (in_doc_tensor[1:] == in_doc_tensor[:-1]) & (in_doc_tensor[1:] > 0)

    return PackedSequence(
        input_ids=torch.tensor(ids, dtype=torch.long),
        position_ids=torch.tensor(positions, dtype=torch.long),
        doc_ids=torch.tensor(doc_ids, dtype=torch.long),
        loss_mask=loss_mask,
        paradigm=paradigm,
        leftover=leftover,
        num_consumed=consumed,
        doc_lengths=[len(piece.token_ids) for piece in pieces],
    )
