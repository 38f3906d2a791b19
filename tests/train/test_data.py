"""The window stream: deterministic, resumable from its state, every document used in order."""

import json

import pytest

from evalkit.attention import Paradigm
from evalkit.corpus.prose import prose_documents
from evalkit.errors import UserError
from evalkit.train.config import DataConfig
from evalkit.train.data import BuiltinSource, JsonlSource, WindowStream, domain_tag_ids, open_source
from evalkit.train.synthetic import SYNTHETIC_VERSION, copy_example, retrieval_example


def write_jsonl(path, docs):
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def test_windows_are_exact_and_deterministic(tokenizer):
    source = BuiltinSource(DataConfig(num_retrieval_docs=50), seed=0, seq_len=256)
    a = WindowStream(source, tokenizer, Paradigm.ANCHOR, 256, seed=3)
    b = WindowStream(source, tokenizer, Paradigm.ANCHOR, 256, seed=3)
    for _ in range(5):
        wa, wb = a.next_window(), b.next_window()
        assert wa.input_ids.shape == (256,)
        assert wa.input_ids.tolist() == wb.input_ids.tolist()
    c = WindowStream(source, tokenizer, Paradigm.ANCHOR, 256, seed=4)
    assert (
        c.next_window().input_ids.tolist()
        != WindowStream(source, tokenizer, Paradigm.ANCHOR, 256, seed=3).next_window().input_ids.tolist()
    )


@pytest.mark.parametrize("paradigm", list(Paradigm))
def test_resuming_from_state_gives_the_same_windows(tokenizer, paradigm, tmp_path):
    docs = [{"text": " ".join(f"w{d}x{i}" for i in range(5 + 37 * d % 90)), "domain": f"src{d % 3}"} for d in range(30)]
    source = JsonlSource(write_jsonl(tmp_path / "d.jsonl", docs), "text", "domain")
    tags = domain_tag_ids(tokenizer, ["src0", "src1", "src2"]) if paradigm.uses_tags else None
    straight = WindowStream(source, tokenizer, paradigm, 96, seed=1, domain_tags=tags)
    expected = [straight.next_window().input_ids.tolist() for _ in range(40)]  # several epochs
    first = WindowStream(source, tokenizer, paradigm, 96, seed=1, domain_tags=tags)
    got = [first.next_window().input_ids.tolist() for _ in range(17)]
    state = json.loads(json.dumps(first.state_dict()))  # survives a round trip through a file
    second = WindowStream(source, tokenizer, paradigm, 96, seed=1, domain_tags=tags)
    second.load_state_dict(state)
    got += [second.next_window().input_ids.tolist() for _ in range(23)]
    assert got == expected


def test_every_document_is_used_once_per_epoch_in_order(tokenizer, tmp_path):
    import re

    docs = [{"text": f"document number {d} " + "filler " * (d % 7)} for d in range(25)]
    source = JsonlSource(write_jsonl(tmp_path / "d.jsonl", docs), "text", "domain")
    stream = WindowStream(source, tokenizer, Paradigm.INTRA_DOC, 64, seed=0)
    # intra_doc windows decode back into one stream: a cut document continues in the next window,
    # behind the BOS that opens every window (data.window_start=bos).
    parts = []
    for _ in range(40):
        carried = stream.state.leftover_tokens is not None
        ids = stream.next_window().input_ids.tolist()
        parts.append(tokenizer.decode(ids[1:] if carried else ids))
    text = "".join(parts)
    seen = [int(n) for n in re.findall(r"document number (\d+) ", text)]
    epochs = [seen[i : i + 25] for i in range(0, len(seen) - 25, 25)]
    assert len(epochs) >= 2
    for epoch in epochs:
        assert sorted(epoch) == list(range(25))  # each document exactly once per epoch
    assert epochs[0] != epochs[1]  # reshuffled every epoch


def test_builtin_source_mixes_prose_and_retrieval():
    source = BuiltinSource(DataConfig(retrieval_fraction=0.5, num_retrieval_docs=500), seed=0, seq_len=1024)
    domains = [source[i][1] for i in range(len(source))]
    assert 0.4 < domains.count("retrieval") / len(domains) < 0.6
    text = source[len(source) - 1][0]
    assert any(ch.isdigit() for ch in text)


def test_builtin_source_mixes_copy_documents_in_their_share():
    source = BuiltinSource(DataConfig(retrieval_fraction=0.4, copy_fraction=0.4, num_retrieval_docs=400), 0, 256)
    domains = [source[i][1] for i in range(len(source))]
    assert domains.count("retrieval") == 400 and domains.count("copy") == 400
    assert 0.1 < domains.count("prose") / len(domains) < 0.3
    assert source.domains() == ["copy", "prose", "retrieval"]
    copy_text = next(source[i][0] for i in range(len(source)) if source[i][1] == "copy")
    assert copy_text == copy_example(0, 0, 256).text


def test_a_corpus_without_copy_documents_keeps_its_fingerprint():
    """Runs started before copy documents existed must resume: their data key is unchanged."""
    import hashlib

    source = BuiltinSource(DataConfig(retrieval_fraction=0.5, num_retrieval_docs=500), seed=0, seq_len=1024)
    repeats = len(source) - 500  # one prose document per index
    key = f"builtin-{SYNTHETIC_VERSION}-{len(prose_documents())}x{repeats // len(prose_documents())}-500-0-1024"
    assert source.fingerprint == hashlib.sha256(key.encode()).hexdigest()[:16]
    with_copy = BuiltinSource(DataConfig(retrieval_fraction=0.5, copy_fraction=0.1, num_retrieval_docs=500), 0, 1024)
    varied = BuiltinSource(
        DataConfig(retrieval_fraction=0.5, num_retrieval_docs=500, retrieval_phrasing="varied"), 0, 1024
    )
    assert len({source.fingerprint, with_copy.fingerprint, varied.fingerprint}) == 3
    assert varied[len(varied) - 1][0] == retrieval_example(499, 0, 1024, "varied").text


def test_domain_tags_from_builtin_tokenizer(tokenizer):
    tags = domain_tag_ids(tokenizer, ["web", "books"])
    assert tokenizer.convert_ids_to_tokens([tags["books"], tags["web"]]) == ["<|domain_0|>", "<|domain_1|>"]


def test_data_errors_are_one_line(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        open_source(DataConfig(source=str(tmp_path / "missing.jsonl")), 0, 128)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"body": "x"}])
    with pytest.raises(UserError, match="no field 'text'"):
        open_source(DataConfig(source=str(bad)), 0, 128)
