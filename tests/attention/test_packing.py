"""pack() and reference_mask() against layouts and masks written out by hand."""

import pytest
import torch

import evalkit.attention.packing as packing
from evalkit.attention import ANCHOR_DOC_ID, PAD_DOC_ID, Document, Paradigm, pack, reference_mask

BOS, EOS = 1, 2
DOCS = [[10, 11], [20], [30, 31, 32]]
TAGS = [101, 102, 103]


def grid(text: str) -> torch.Tensor:
    """A mask written as rows of 0/1 characters."""
    rows = [line.strip() for line in text.strip().splitlines()]
    return torch.tensor([[c == "1" for c in row] for row in rows])


CAUSAL_10 = grid("""
1000000000
1100000000
1110000000
1111000000
1111100000
1111110000
1111111000
1111111100
1111111110
1111111111
""")

# Documents at tokens 0-3, 4-6, 7-9; each sees only itself, causally.
INTRA_DOC_10 = grid("""
1000000000
1100000000
1110000000
1111000000
0000100000
0000110000
0000111000
0000000100
0000000110
0000000111
""")

# The anchor (token 0) sees itself; documents at 1-3, 4-5, 6-9 see themselves plus the anchor.
ANCHOR_10 = grid("""
1000000000
1100000000
1110000000
1111000000
1000100000
1000110000
1000001000
1000001100
1000001110
1000001111
""")

# Tagged pieces at 1-4, 5-7, 8-9, plus the anchor.
ANCHOR_TAG_10 = grid("""
1000000000
1100000000
1110000000
1111000000
1111100000
1000010000
1000011000
1000011100
1000000010
1000000011
""")


def test_full_layout():
    p = pack(DOCS, 10, "full", bos_id=BOS, eos_id=EOS)
    assert p.input_ids.tolist() == [1, 10, 11, 2, 1, 20, 2, 1, 30, 31]
    assert p.position_ids.tolist() == list(range(10))
    assert p.doc_ids.tolist() == [1, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    # No loss on a BOS, nor on the token after it (predicted from no document).
    assert p.loss_mask.tolist() == [False, False, True, True, False, False, True, False, False, True]
    assert p.leftover == Document(tokens=[32], tag=None, continued=True)
    assert p.num_consumed == 3
    assert torch.equal(reference_mask(p), CAUSAL_10)
    assert p.attention_doc_ids() is None


@pytest.mark.parametrize("paradigm", ["intra_doc", "intra_doc_reset"])
def test_intra_doc_layouts(paradigm):
    p = pack(DOCS, 10, paradigm, bos_id=BOS, eos_id=EOS)
    assert p.input_ids.tolist() == [1, 10, 11, 2, 1, 20, 2, 1, 30, 31]
    expected_pos = [0, 1, 2, 3, 0, 1, 2, 0, 1, 2] if paradigm == "intra_doc_reset" else list(range(10))
    assert p.position_ids.tolist() == expected_pos
    assert p.loss_mask.tolist() == [False, False, True, True, False, False, True, False, False, True]
    assert torch.equal(reference_mask(p), INTRA_DOC_10)


def test_anchor_layout():
    p = pack(DOCS, 10, "anchor", bos_id=BOS, eos_id=EOS)
    assert p.input_ids.tolist() == [1, 10, 11, 2, 20, 2, 30, 31, 32, 2]
    assert p.position_ids.tolist() == list(range(10))
    assert p.doc_ids.tolist() == [ANCHOR_DOC_ID, 1, 1, 1, 2, 2, 3, 3, 3, 3]
    # No loss on the anchor, nor on each document's first token (predicted from another document).
    assert p.loss_mask.tolist() == [False, False, True, True, False, True, False, True, True, True]
    assert p.leftover is None
    assert torch.equal(reference_mask(p), ANCHOR_10)


def test_anchor_tag_layout_and_carry():
    p = pack(DOCS, 10, "anchor_tag", bos_id=BOS, eos_id=EOS, domain_tags=TAGS)
    assert p.input_ids.tolist() == [1, 101, 10, 11, 2, 102, 20, 2, 103, 30]
    assert p.doc_ids.tolist() == [0, 1, 1, 1, 1, 2, 2, 2, 3, 3]
    # No loss on the anchor, the tags, nor the token after a tag.
    assert p.loss_mask.tolist() == [False, False, False, True, True, False, False, True, False, False]
    assert torch.equal(reference_mask(p), ANCHOR_TAG_10)
    assert p.leftover == Document(tokens=[31, 32], tag=103, continued=True)
    with pytest.raises(ValueError, match="domain tag"):
        pack([p.leftover, [40]], 8, "anchor_tag", bos_id=BOS, eos_id=EOS)  # [40] has no tag


def test_carry_into_next_window_without_bos():
    """window_start="document" (the packing before the setting): the carried rest has no BOS."""
    p = pack(DOCS, 10, "intra_doc", bos_id=BOS, eos_id=EOS)
    nxt = pack([p.leftover, [40, 41]], 8, "intra_doc", bos_id=BOS, eos_id=EOS, window_start="document")
    assert nxt.input_ids.tolist() == [32, 2, 1, 40, 41, 2, 2, 2]
    assert nxt.doc_ids.tolist() == [1, 1, 2, 2, 2, 2, PAD_DOC_ID, PAD_DOC_ID]
    assert nxt.loss_mask.tolist() == [False, True, False, False, True, True, False, False]
    assert nxt.leftover is None


def test_anchor_tag_carried_piece_keeps_tag():
    rest = Document(tokens=[31, 32], tag=103, continued=True)
    nxt = pack([rest, Document([40], tag=104)], 8, "anchor_tag", bos_id=BOS, eos_id=EOS)
    assert nxt.input_ids.tolist() == [1, 103, 31, 32, 2, 104, 40, 2]
    # 31 follows its tag, not 30: its context was cut, so it is no target.
    assert nxt.loss_mask.tolist() == [False, False, False, True, True, False, False, True]


def test_padding_when_documents_run_out():
    p = pack([[10]], 6, "intra_doc_reset", bos_id=BOS, eos_id=EOS)
    assert p.input_ids.tolist() == [1, 10, 2, 2, 2, 2]
    assert p.doc_ids.tolist() == [1, 1, 1, PAD_DOC_ID, PAD_DOC_ID, PAD_DOC_ID]
    assert p.position_ids.tolist() == [0, 1, 2, 0, 1, 2]
    assert p.loss_mask.tolist() == [False, False, True, False, False, False]


def test_window_too_small_for_next_document_pads():
    # 1 token of room: a BOS alone would carry no content, so the rest is padding and the
    # document is not consumed.
    p = pack([[10, 11], [20, 21]], 5, "intra_doc", bos_id=BOS, eos_id=EOS)
    assert p.input_ids.tolist() == [1, 10, 11, 2, 2]
    assert p.doc_ids.tolist() == [1, 1, 1, 1, PAD_DOC_ID]
    assert p.num_consumed == 1 and p.leftover is None


# Interleaving with the length and spacing thresholds lowered so a small example splits.
# seed 0 cuts doc 1 = [BOS 10 11 12 13 14 15 EOS] into [BOS 10][11 12 13][14 15 EOS] and
# doc 2 = [BOS 20 21 22 23 24 EOS] into [BOS 20 21 22][23][24 EOS]; doc 3 is cut by the window.
INTERLEAVED_IDS = [1, 30, 31, 1, 10, 1, 20, 21, 22, 11, 12, 13, 23, 14, 15, 2, 24, 2]
INTERLEAVED_DOCS = [3, 3, 3, 1, 1, 2, 2, 2, 2, 1, 1, 1, 2, 1, 1, 1, 2, 2]
INTERLEAVED_MASK = grid("""
100000000000000000
110000000000000000
111000000000000000
000100000000000000
000110000000000000
000001000000000000
000001100000000000
000001110000000000
000001111000000000
000110000100000000
000110000110000000
000110000111000000
000001111000100000
000110000111010000
000110000111011000
000110000111011100
000001111000100010
000001111000100011
""")


def test_interleaved_layout(monkeypatch):
    monkeypatch.setattr(packing, "INTERLEAVE_MIN_LEN", 4)
    monkeypatch.setattr(packing, "INTERLEAVE_MIN_GAP", 1)
    docs = [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24], [30, 31]]
    p = pack(docs, 18, "intra_doc_interleaved", bos_id=BOS, eos_id=EOS, seed=0)
    assert p.input_ids.tolist() == INTERLEAVED_IDS
    assert p.doc_ids.tolist() == INTERLEAVED_DOCS
    assert p.position_ids.tolist() == list(range(18))
    # A chunk that resumes a document right after another document gets no loss on its first token.
    assert p.loss_mask.tolist() == [
        False, False, True, False, False, False, False, True, True,
        False, True, True, False, False, True, True, False, True,
    ]  # fmt: skip
    assert torch.equal(reference_mask(p), INTERLEAVED_MASK)


def test_anchor_interleaved_adds_anchor_column(monkeypatch):
    monkeypatch.setattr(packing, "INTERLEAVE_MIN_LEN", 4)
    monkeypatch.setattr(packing, "INTERLEAVE_MIN_GAP", 1)
    docs = [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24], [30, 31]]
    p = pack(docs, 18, "anchor_interleaved", bos_id=BOS, eos_id=EOS, seed=0)
    assert p.input_ids.tolist() == [1, 30, 31, 2, 10, 11, 20, 21, 22, 23, 12, 13, 14, 24, 15, 2, 2, 2]
    assert p.doc_ids.tolist() == [0, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1, 1, 1, 2, 1, 1, 2, -1]
    mask = reference_mask(p)
    assert mask[:, 0].all()  # every token sees the anchor
    assert mask[0].sum() == 1  # the anchor sees only itself
    assert mask[10].nonzero().flatten().tolist() == [0, 4, 5, 10]  # doc 1's second chunk


@pytest.mark.parametrize("seed", range(20))
def test_interleaving_rules_at_real_sizes(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(20, 700, (8,), generator=g).tolist()
    docs = [[1000 * (d + 1) + i for i in range(n)] for d, n in enumerate(lengths)]
    p = pack(docs, 2048, "intra_doc_interleaved", bos_id=BOS, eos_id=EOS, seed=seed)
    for d in p.doc_ids.unique().tolist():
        if d == PAD_DOC_ID:
            continue
        where = (p.doc_ids == d).nonzero().flatten()
        tokens = p.input_ids[where].tolist()
        content = [t for t in tokens if t not in (BOS, EOS)]
        assert content == sorted(content)  # each document keeps its own order
        runs = 1 + int(((where[1:] - where[:-1]) > 1).sum())
        n = len(tokens)
        if n < 64:
            assert runs == 1
        else:
            assert runs <= 3  # 2 or 3 chunks (adjacent chunks of one document merge into a run)
    assert p.position_ids.tolist() == list(range(2048))


def test_seq_len_and_tags_validated():
    with pytest.raises(ValueError, match="seq_len"):
        pack(DOCS, 1, "full", bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="unknown paradigm"):
        pack(DOCS, 8, "causal", bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="domain_tags has 2"):
        pack(DOCS, 8, "anchor_tag", bos_id=BOS, eos_id=EOS, domain_tags=[1, 2])


def test_every_paradigm_is_exactly_seq_len():
    for paradigm in Paradigm:
        tags = TAGS if paradigm.uses_tags else None
        for seq_len in (2, 3, 7, 64):
            p = pack(DOCS, seq_len, paradigm, bos_id=BOS, eos_id=EOS, domain_tags=tags)
            for field in (p.input_ids, p.position_ids, p.doc_ids, p.loss_mask):
                assert field.shape == (seq_len,)
