"""The anchor is on record: where an anchor is used (--encoding anchor, paradigm anchor), the token,
its id and why (BOS, or EOS because the tokenizer has no BOS) are in the summary, the engine info
and the checkpoint's meta.json, and noted on stderr."""

import json
from pathlib import Path

from tests.helpers import TINY_BASE, copy_tiny_base, edit_json, evalkit_here
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)


def added_token_id(content: str) -> int:
    """The id tokenizer.json gives a special token: the reference the recorded anchor must match."""
    added = json.loads((TINY_BASE / "tokenizer.json").read_text())["added_tokens"]
    return next(token["id"] for token in added if token["content"] == content)


EOS_ANCHOR = {"token": "</s>", "why": "EOS: the tokenizer has no BOS"}


EOS_NOTE = "note: the anchor token is '</s>' (id {}, EOS: the tokenizer has no BOS)"


def without_bos(ckpt: Path) -> Path:
    edit_json(ckpt / "tokenizer_config.json", lambda c: {**c, "bos_token": None})
    return ckpt


def test_the_anchor_token_and_why_are_recorded_where_an_anchor_is_used(tmp_path, capsys):
    ckpt = without_bos(copy_tiny_base(tmp_path / "run" / "step-1"))
    out = tmp_path / "out"
    args = ["ruler", ckpt, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1", "--encoding", "anchor"]
    result = evalkit_here(capsys, *args, "--doc-tokens", "128", "--out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    eos = {"id": added_token_id("</s>"), **EOS_ANCHOR}
    summary = json.loads((out / "run" / "step-1" / "ruler-summary.json").read_text())
    assert summary["provenance"]["anchor"] == eos
    assert summary["provenance"]["engine"]["anchor_token"] == eos
    assert EOS_NOTE.format(added_token_id("</s>")) in result.stderr

    standard = copy_tiny_base(tmp_path / "std" / "step-1")  # with a BOS: the BOS, said so
    result = evalkit_here(capsys, *args[:1], standard, *args[2:], "--doc-tokens", "128", "--out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "std" / "step-1" / "ruler-summary.json").read_text())
    assert summary["provenance"]["anchor"] == {"id": added_token_id("<s>"), "token": "<s>", "why": "BOS"}


def test_training_under_the_anchor_paradigm_records_its_anchor(tmp_path, capsys):
    ckpt = without_bos(copy_tiny_base(tmp_path / "base"))
    out = tmp_path / "run"
    args = ["train", "--config", "tiny-cpu", "--model", ckpt, "--max-steps", "1", "--set", "paradigm=anchor"]
    result = evalkit_here(capsys, *args, "--out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    assert EOS_NOTE.format(added_token_id("</s>")) in result.stderr
    (checkpoint,) = out.glob("step-*")
    meta = json.loads((checkpoint / "meta.json").read_text())
    assert meta["anchor_token"] == {"id": added_token_id("</s>"), **EOS_ANCHOR}
