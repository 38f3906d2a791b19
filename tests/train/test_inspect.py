"""`evalkit train --inspect DIR`: the first windows as training builds them, checked against the
stream itself and against the attention mask written from its definition (shared/paper.md, section 2)."""

import json
import subprocess
import sys

import pytest

from evalkit.attention import ANCHOR_DOC_ID, Paradigm
from evalkit.attention.anchor import anchor_token_id
from evalkit.train import load_recipe
from evalkit.train.loop import build_stream
from evalkit.train.model import recipe_tokenizer
from tests.train.helpers import MICRO

PARADIGMS = [p.value for p in Paradigm]
SETS = [*MICRO, "seq_len=128"]
WINDOWS, SHOWN = 2, 96  # windows written per paradigm; tokens of each window the mask covers


def evalkit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalkit.cli", *args], capture_output=True, text=True, timeout=600)


def inspect_args(out, paradigms: str, *extra: str, sets: list[str] = SETS) -> list[str]:
    sets = [arg for s in sets for arg in ("--set", s)]
    return ["train", "--config", "tiny-cpu", "--paradigm", paradigms, *sets, "--inspect", str(out), *extra]


def definition_mask(paradigm: str, doc_ids: list[int], n: int) -> list[str]:
    """The paper's rule, written out: full is causal; the others see their own document and the anchor."""
    rows = []
    for q in range(n):
        row = ""
        for k in range(n):
            same = paradigm == "full" or doc_ids[q] == doc_ids[k] or doc_ids[k] == ANCHOR_DOC_ID
            row += "1" if k <= q and same else "0"
        rows.append(row)
    return rows


def short_documents(path):
    """Short documents from two domains: several per window, some long enough to interleave."""
    lines = []
    for d in range(60):
        words = 24 if d % 6 == 0 else 1 + d % 5  # about 70 tokens (split when interleaved), or 8 to 20
        text = f"document {d} says " + " ".join(f"w{(d * 7 + i) % 50}" for i in range(words))
        lines.append(json.dumps({"text": text, "domain": "web" if d % 2 else "books"}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def inspected(tmp_path_factory):
    """One --inspect run over every paradigm, on short documents; (its DIR, its result, its --set)."""
    folder = tmp_path_factory.mktemp("inspect")
    sets = [*SETS, f"data.source={short_documents(folder / 'docs.jsonl')}"]
    out = folder / "windows"
    args = ["--inspect-windows", str(WINDOWS), "--inspect-tokens", str(SHOWN)]
    result = evalkit(*inspect_args(out, ",".join(PARADIGMS), *args, sets=sets))
    assert result.returncode == 0, result.stderr[-2000:]
    return out, result, sets


@pytest.mark.parametrize("paradigm", PARADIGMS)
def test_inspect_writes_the_windows_training_would_see(inspected, paradigm):
    out, result, sets = inspected
    record = json.loads((out / paradigm / "window.json").read_text())
    config = load_recipe("tiny-cpu", {"paradigm": paradigm}, sets)
    tokenizer = recipe_tokenizer(config)
    stream = build_stream(config, tokenizer)[1]
    assert (record["recipe"], record["paradigm"], record["seq_len"]) == ("tiny-cpu", paradigm, 128)
    assert (record["window_start"], record["mask_tokens"]) == ("bos", SHOWN)
    assert len(record["windows"]) == WINDOWS
    for written in record["windows"]:
        window = stream.next_window()
        assert written["input_ids"] == window.input_ids.tolist()
        assert written["position_ids"] == window.position_ids.tolist()
        assert written["doc_ids"] == window.doc_ids.tolist()
        assert written["loss_mask"] == window.loss_mask.tolist()
        assert written["tokens"] == [tokenizer.decode([i]) for i in written["input_ids"]]
        assert written["anchor_index"] == (0 if Paradigm(paradigm).has_anchor else None)
        assert written["input_ids"][0] == anchor_token_id(tokenizer) and written["position_ids"][0] == 0
        assert written["attention_mask"] == definition_mask(paradigm, written["doc_ids"], SHOWN)
        assert len(set(written["doc_ids"][:SHOWN]) - {ANCHOR_DOC_ID}) >= 3  # a mask with documents to tell apart
    png = (out / paradigm / "mask.png").read_bytes()
    assert png.startswith(b"\x89PNG") and b"matplotlib" in png.lower()
    assert f"wrote {out / paradigm / 'mask.png'}" in result.stdout


def test_the_masks_differ_as_the_paradigms_do(inspected):
    """Not one mask for all: full is plain causal, the anchor column is open to every query."""
    out, _, _ = inspected
    masks = {p: json.loads((out / p / "window.json").read_text())["windows"][0]["attention_mask"] for p in PARADIGMS}
    assert masks["full"] == ["1" * (q + 1) + "0" * (SHOWN - q - 1) for q in range(SHOWN)]
    assert all(row[0] == "1" for row in masks["anchor"]) and masks["anchor"] != masks["full"]
    assert masks["intra_doc"] != masks["full"] and masks["intra_doc_interleaved"] != masks["intra_doc"]


def test_inspect_again_replaces_its_own_files_but_never_a_users(tmp_path):
    out = tmp_path / "windows"
    assert evalkit(*inspect_args(out, "full")).returncode == 0
    again = evalkit(*inspect_args(out, "full", "--inspect-tokens", "16"))
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "full" / "window.json").read_text())["mask_tokens"] == 16
    mine = out / "anchor" / "window.json"
    mine.parent.mkdir()
    mine.write_text('{"my": "notes"}')
    refused = evalkit(*inspect_args(out, "anchor"))
    assert refused.returncode == 2 and "was not written by evalkit" in refused.stderr
    assert mine.read_text() == '{"my": "notes"}' and not (out / "anchor" / "mask.png").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--paradigm", "full,anchor"], "--paradigm takes one paradigm to train"),
        (["--paradigm", "full,anchr", "--inspect", "{tmp}/w"], "unknown paradigm 'anchr'"),
        (["--inspect", "{tmp}/file"], "is a file, not a directory"),
        (["--inspect", "{tmp}/w", "--inspect-windows", "0"], "--inspect-windows must be at least 1, got 0"),
        (["--inspect", "{tmp}/w", "--resume"], "--inspect trains nothing"),
    ],
)
def test_bad_inspect_input_is_one_line_error(extra, message, tmp_path):
    (tmp_path / "file").write_text("mine")
    args = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    result = evalkit("train", "--config", "tiny-cpu", "--out", str(tmp_path / "run"), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists() and not (tmp_path / "w").exists()


@pytest.mark.real
def test_inspect_with_smollm2s_tokenizer(smollm2, tmp_path):
    """A real tokenizer: its anchor opens every window, and each token's text is its own."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    out = tmp_path / "windows"
    result = evalkit(*inspect_args(out, "full,intra_doc_reset,anchor", "--set", f"data.tokenizer={smollm2}"))
    assert result.returncode == 0, result.stderr[-2000:]
    for paradigm in ("full", "intra_doc_reset", "anchor"):
        (window,) = json.loads((out / paradigm / "window.json").read_text())["windows"]
        assert window["input_ids"][0] == anchor_token_id(tokenizer) and max(window["input_ids"]) >= 2048
        assert window["tokens"] == [tokenizer.decode([i]) for i in window["input_ids"]]
