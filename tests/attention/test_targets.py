"""Training targets, one rule for every paradigm: input_ids[i] is a target iff it and the token
before it belong to the same document piece (its content tokens and its EOS; the anchor, a BOS,
a tag and padding belong to none). The masks and target lists here are written from that rule,
reading only token values, never pack's doc_ids or loss_mask code."""

import pytest

import evalkit.attention.packing as packing
from evalkit.attention import Document, Paradigm, pack

BOS, EOS = 1, 2
TAGS = [3, 4, 5]  # below 10: content tokens are 10 and up, document k's are 10k..10k+9


def owner(ids: list[int]) -> list[int | None]:
    """Each token's document: content 10k+j is document k's; an EOS right after content is that
    document's own; the anchor, a BOS, a tag, padding: None."""
    out: list[int | None] = []
    for i, t in enumerate(ids):
        if t >= 10:
            out.append(t // 10)
        elif t == EOS and i > 0 and ids[i - 1] >= 10:
            out.append(out[-1])
        else:
            out.append(None)
    return out


def rule_mask(ids: list[int]) -> list[bool]:
    docs = owner(ids)
    return [i > 0 and docs[i] is not None and docs[i] == docs[i - 1] for i in range(len(ids))]


def trained_pairs(packed) -> list[tuple[int, int]]:
    """(predictor token, target token) of every target, sorted."""
    ids, mask = packed.input_ids.tolist(), packed.loss_mask.tolist()
    return sorted((ids[i - 1], ids[i]) for i in range(1, len(ids)) if mask[i])


def _docs(carried: bool) -> list[Document]:
    return [
        Document([30, 31, 32], tag=TAGS[2], continued=carried),
        Document([10, 11, 12], tag=TAGS[0]),
        Document([20, 21], tag=TAGS[1]),
    ]


# What the rule trains on these documents: every token of a piece after its first, predicted
# from the one before it; the EOS from the last content token.
WHOLE_TARGETS = sorted([(30, 31), (31, 32), (32, EOS), (10, 11), (11, 12), (12, EOS), (20, 21), (21, EOS)])


@pytest.mark.parametrize("window_start", ["bos", "document"])
@pytest.mark.parametrize("carried", [False, True])
@pytest.mark.parametrize("paradigm", list(Paradigm))
def test_every_paradigm_trains_the_same_targets(paradigm, carried, window_start):
    """The same documents in one window train the same (predictor, target) pairs under every
    paradigm: no document's (nor a carried piece's) first token, no BOS, tag, anchor or padding."""
    p = pack(_docs(carried), 16, paradigm, bos_id=BOS, eos_id=EOS, window_start=window_start)
    assert trained_pairs(p) == WHOLE_TARGETS
    assert p.loss_mask.tolist() == rule_mask(p.input_ids.tolist())


@pytest.mark.parametrize("window_start", ["bos", "document"])
@pytest.mark.parametrize("paradigm", list(Paradigm))
def test_a_cut_document_trains_everything_but_the_token_after_the_cut(paradigm, window_start):
    """Windows too short for a document: over the windows, its targets are all its pairs but the
    one across each cut (a carried piece's first token lost its context)."""
    doc = list(range(40, 50))
    pending: list = [Document(doc, tag=TAGS[0])]
    pairs, cut_before = [], []
    while pending:
        p = pack(pending, 5, paradigm, bos_id=BOS, eos_id=EOS, window_start=window_start)
        assert p.loss_mask.tolist() == rule_mask(p.input_ids.tolist())
        pairs += trained_pairs(p)
        pending = [p.leftover] if p.leftover else []
        cut_before += [p.leftover.tokens[0]] if p.leftover else []
    assert len(cut_before) >= 2
    every = list(zip(doc, doc[1:] + [EOS]))
    assert sorted(pairs) == [(a, b) for a, b in every if b not in cut_before]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("paradigm", ["intra_doc_interleaved", "anchor_interleaved"])
def test_interleaving_drops_only_the_first_token_of_a_resumed_chunk(monkeypatch, paradigm, seed):
    """Under interleaving the same rule also drops the first token of a chunk that resumes a
    document after another document's token (which cannot see that document), and nothing else."""
    monkeypatch.setattr(packing, "INTERLEAVE_MIN_LEN", 4)
    monkeypatch.setattr(packing, "INTERLEAVE_MIN_GAP", 1)
    docs = [list(range(10 * k, 10 * k + 9)) for k in (1, 2, 3, 4)]  # 9: no chunk is an EOS alone
    p = pack(docs, 48, paradigm, bos_id=BOS, eos_id=EOS, seed=seed)
    ids = p.input_ids.tolist()
    assert p.loss_mask.tolist() == rule_mask(ids)
    # A document's pair whose tokens are not adjacent in the window: its second token opens a
    # chunk resumed after another document's token.
    adjacent = set(zip(ids, ids[1:]))
    every = [pair for d in docs for pair in zip(d, d[1:] + [EOS])]
    resumed = [pair for pair in every if pair not in adjacent]
    assert resumed  # the draw split documents
    assert trained_pairs(p) == sorted(set(every) - set(resumed))
