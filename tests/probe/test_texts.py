"""Token windows: BOS first, the right shapes, short texts skipped and counted, bad files refused."""

import json

import pytest

from evalkit.errors import UserError
from evalkit.probe.texts import TextSource, special_prefix


def test_builtin_prose_windows_start_with_bos(tokenizer):
    windows = TextSource(tokenizer).windows(64, 5)
    assert windows.ids_NT.shape == (5, 64)
    assert (windows.ids_NT[:, 0] == tokenizer.bos_token_id).all()
    assert (windows.ids_NT[:, 1:] != tokenizer.bos_token_id).all()  # one sink per window, at its start
    assert special_prefix(tokenizer) == [tokenizer.bos_token_id]


def test_consecutive_prose_windows_do_not_repeat_text(tokenizer):
    ids = TextSource(tokenizer).windows(32, 3).ids_NT
    assert not (ids[0] == ids[1]).all() and not (ids[1] == ids[2]).all()


def test_jsonl_texts_are_cut_and_short_ones_counted(tokenizer, tmp_path):
    path = tmp_path / "texts.jsonl"
    records = [{"text": "short"}, {"text": "a much longer text " * 30}, {"text": "another long text " * 30}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    windows = TextSource(tokenizer, path, max_length=40).windows(40, 10)
    assert windows.ids_NT.shape == (2, 40)
    assert windows.skipped_short == 1
    assert (windows.ids_NT[:, 0] == tokenizer.bos_token_id).all()


def test_plain_text_file_is_cut_into_windows(tokenizer, tmp_path):
    path = tmp_path / "book.txt"
    path.write_text("\n\n".join(f"Paragraph {i} says something about attention sinks." for i in range(60)))
    windows = TextSource(tokenizer, path).windows(50, 3)
    assert windows.ids_NT.shape == (3, 50)


def test_texts_too_short_for_the_length_are_a_user_error(tokenizer, tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_text(json.dumps({"text": "too short"}) + "\n")
    with pytest.raises(UserError, match="no text .* has 64 tokens"):
        TextSource(tokenizer, path).windows(64, 2)
    plain = tmp_path / "tiny.txt"
    plain.write_text("only a few words")
    with pytest.raises(UserError, match="fewer than one window"):
        TextSource(tokenizer, plain).windows(64, 2)


@pytest.mark.parametrize("line", ["{not json", '{"body": "x"}', '["text"]', '{"text": 3}'])
def test_bad_jsonl_lines_name_the_line(tokenizer, tmp_path, line):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "fine"}) + "\n" + line + "\n")
    with pytest.raises(
        UserError, match=r"^--texts \S*bad\.jsonl line 2: not a JSON object with a string `text` field$"
    ):
        TextSource(tokenizer, path)
