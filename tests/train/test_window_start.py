"""data.window_start: every window of every paradigm opens with a BOS at position 0 ("bos"), or
packs as before the setting existed ("document"); layouts and masks written out by hand."""

import json
import subprocess
import sys

import pytest
import torch

import evalkit.attention.packing as packing
from evalkit.attention import PAD_DOC_ID, Document, Paradigm, pack
from evalkit.errors import UserError
from evalkit.train import checkpoint as ckpt
from evalkit.train import load_recipe
from evalkit.train.data import data_fingerprint, open_source
from evalkit.train.loop import build_stream, train
from evalkit.train.model import recipe_tokenizer
from tests.train.helpers import MICRO, micro_args, micro_config

BOS, EOS = 1, 2
F, T = False, True
NON_ANCHOR = [p.value for p in Paradigm if not p.has_anchor]
ANCHORED = [p.value for p in Paradigm if p.has_anchor]


def _stream(paradigm: str, window_start: str, seq_len: int = 64):
    config = load_recipe(
        "tiny-cpu", {"paradigm": paradigm}, [*MICRO, f"seq_len={seq_len}", f"data.window_start={window_start}"]
    )
    return build_stream(config, recipe_tokenizer(config))[1]


# ----------------------------------------------------------------------------- pack, by hand


@pytest.mark.parametrize(
    "paradigm, positions",
    [
        ("full", list(range(8))),
        ("intra_doc", list(range(8))),
        ("intra_doc_reset", [0, 1, 2, 0, 1, 2, 3, 0]),
    ],
)
def test_a_carried_rest_opens_its_window_with_a_bos_and_its_first_token_is_no_target(paradigm, positions):
    rest = Document(tokens=[32], continued=True)
    p = pack([rest, [40, 41]], 8, paradigm, bos_id=BOS, eos_id=EOS)
    assert p.input_ids.tolist() == [BOS, 32, EOS, BOS, 40, 41, EOS, EOS]
    assert p.doc_ids.tolist() == [1, 1, 1, 2, 2, 2, 2, PAD_DOC_ID]  # the BOS belongs to the carried piece
    assert p.position_ids.tolist() == positions
    # 32 and 40 follow a BOS, a token of no document: no targets, as behind the anchor.
    assert p.loss_mask.tolist() == [F, F, T, F, F, T, T, F]


def test_the_old_layout_under_document():
    rest = Document(tokens=[32], continued=True)
    p = pack([rest, [40, 41]], 8, "intra_doc", bos_id=BOS, eos_id=EOS, window_start="document")
    assert p.input_ids.tolist() == [32, EOS, BOS, 40, 41, EOS, EOS, EOS]
    assert p.doc_ids.tolist() == [1, 1, 2, 2, 2, 2, PAD_DOC_ID, PAD_DOC_ID]
    assert p.loss_mask.tolist() == [F, T, F, F, T, T, F, F]


def test_a_carried_rest_cut_again_carries_on_with_a_bos_each_window():
    first = pack([Document([50, 51, 52, 53, 54], continued=True)], 4, "full", bos_id=BOS, eos_id=EOS)
    assert first.input_ids.tolist() == [BOS, 50, 51, 52]
    assert first.loss_mask.tolist() == [F, F, T, T]
    assert first.leftover == Document(tokens=[53, 54], continued=True)
    second = pack([first.leftover, [60]], 8, "full", bos_id=BOS, eos_id=EOS)
    assert second.input_ids.tolist() == [BOS, 53, 54, EOS, BOS, 60, EOS, EOS]
    assert second.loss_mask.tolist() == [F, F, T, T, F, F, T, F]


@pytest.mark.parametrize("paradigm", ["anchor", "anchor_interleaved"])
def test_anchor_windows_are_the_same_under_both_settings(paradigm):
    docs = [Document([30, 31, 32], continued=True), Document([40, 41])]
    a, b = (pack(docs, 9, paradigm, bos_id=BOS, eos_id=EOS, window_start=s) for s in ("bos", "document"))
    for name in ("input_ids", "position_ids", "doc_ids", "loss_mask"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert int(a.input_ids[0]) == BOS and sorted(a.input_ids.tolist()) == [1, 2, 2, 2, 30, 31, 32, 40, 41]
    first_of_rest = int((a.doc_ids == 1).nonzero()[0])
    assert int(a.input_ids[first_of_rest]) == 30 and not a.loss_mask[first_of_rest]  # the rule "bos" shares


def test_interleaved_window_with_a_carried_rest(monkeypatch):
    """tests/attention/test_packing.py's interleaved example, its first document now a carried rest:
    the same layout (the rest gets the BOS a new document has) and the same targets."""
    monkeypatch.setattr(packing, "INTERLEAVE_MIN_LEN", 4)
    monkeypatch.setattr(packing, "INTERLEAVE_MIN_GAP", 1)
    docs = [Document([10, 11, 12, 13, 14, 15], continued=True), [20, 21, 22, 23, 24], [30, 31]]
    p = pack(docs, 18, "intra_doc_interleaved", bos_id=BOS, eos_id=EOS, seed=0)
    assert p.input_ids.tolist() == [1, 30, 31, 1, 10, 1, 20, 21, 22, 11, 12, 13, 23, 14, 15, 2, 24, 2]
    assert p.loss_mask.tolist() == [
        F, F, T, F, F, F, F, T, T,
        F, T, T, F, F, T, T, F, T,
    ]  # fmt: skip


def test_pack_refuses_an_unknown_window_start():
    with pytest.raises(ValueError, match="window_start must be one of bos, document"):
        pack([[10]], 4, "full", bos_id=BOS, eos_id=EOS, window_start="eos")


# ----------------------------------------------------------------------------- the stream


@pytest.mark.parametrize("paradigm", [p.value for p in Paradigm])
def test_under_bos_every_window_of_every_paradigm_opens_with_the_bos_at_position_0(paradigm):
    stream = _stream(paradigm, "bos")
    carried = 0
    for _ in range(200):
        rest = stream.state.leftover_tokens
        w = stream.next_window()
        assert int(w.input_ids[0]) == stream.bos_id and int(w.position_ids[0]) == 0 and not w.loss_mask[0]
        if rest is None or Paradigm(paradigm).has_anchor:
            continue
        carried += 1
        # The carried rest is piece 1: its BOS, then its first token, which is no target.
        where = (w.doc_ids == 1).nonzero().flatten().tolist()
        assert int(w.input_ids[where[0]]) == stream.bos_id and int(w.input_ids[where[1]]) == rest[0]
        assert not w.loss_mask[where[1]]
    assert Paradigm(paradigm).has_anchor or carried > 150  # most windows continue a cut document


@pytest.mark.parametrize("paradigm", NON_ANCHOR)
def test_under_document_few_windows_open_with_a_bos(paradigm):
    """As measured before the setting (seq_len 64): 1 window in 150 (11 interleaved) opens with a BOS."""
    stream = _stream(paradigm, "document")
    opening = sum(int(stream.next_window().input_ids[0]) == stream.bos_id for _ in range(150))
    assert opening <= 15


@pytest.mark.parametrize("paradigm", ANCHORED)
def test_anchor_streams_do_not_change(paradigm):
    a, b = _stream(paradigm, "bos"), _stream(paradigm, "document")
    for _ in range(50):
        assert torch.equal(a.next_window().input_ids, b.next_window().input_ids)


def test_bad_window_start_is_a_one_line_error():
    with pytest.raises(UserError, match="data.window_start must be one of bos, document, got 'eos'"):
        load_recipe("tiny-cpu", sets=["data.window_start=eos"])


# ----------------------------------------------------------------------------- records and resume


def test_the_fingerprint_is_the_sources_under_document_only():
    config = load_recipe("tiny-cpu", sets=MICRO)
    source = open_source(config.data, config.seed, config.seq_len)
    assert data_fingerprint(source, "document") == source.fingerprint
    assert data_fingerprint(source, "bos") != source.fingerprint and len(data_fingerprint(source, "bos")) == 16


def test_a_run_saved_before_window_start_resumes_only_as_document(tmp_path):
    """A checkpoint without data.window_start was packed as "document": resuming it with the new
    default is refused with the fix in one line, and with the fix it resumes."""
    run = train(micro_config(tmp_path / "run", "data.window_start=document", max_steps=2), show_progress=False)
    source_fingerprint = open_source(micro_config(run).data, 0, 128).fingerprint
    for _, path in ckpt.complete_checkpoints(run):
        meta = json.loads((path / ckpt.META).read_text())
        assert meta["data_fingerprint"] == source_fingerprint  # as before the setting existed
        del meta["config"]["data"]["window_start"]  # as written by an older evalkit
        (path / ckpt.META).write_text(json.dumps(meta))
    result = subprocess.run(
        [sys.executable, "-m", "evalkit.cli", *micro_args(run, max_steps=4), "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --resume: the run was packed with data.window_start=document, this config asks bos; "
        "resume with --set data.window_start=document (or start a new --out)"
    ]
    train(micro_config(run, "data.window_start=document", max_steps=4), resume=True, show_progress=False)
    assert [s for s, _ in ckpt.complete_checkpoints(run)][-1] == 4
