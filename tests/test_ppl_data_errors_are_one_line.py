"""`ppl --data` that cannot be read as documents is one line naming the file (and the line or row),
never a traceback and never a silently wrong document."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from evalkit import ppl
from evalkit.errors import UserError
from tests.test_ppl import TINY

CASES = {
    "latin1.jsonl": ('{"text": "fine"}\n{"text": "caf\xe9"}\n'.encode("latin-1"), "line 2: not UTF-8 text"),
    "latin1.txt": ("one\ntwo caf\xe9\n".encode("latin-1"), "line 2: not UTF-8 text"),
    "nested.jsonl": (b'{"text": "fine"}\n' + b"[" * 100_000 + b"\n", "line 2: not a JSON object"),
    "surrogate.jsonl": (b'{"text": "a \\ud800 b"}\n', "line 1: its `text` holds an unpaired surrogate"),
    "no-text.jsonl": (b'{"text": "fine"}\n{"title": "x"}\n', "line 2: not a JSON object with a string `text`"),
}


@pytest.mark.parametrize("name", CASES)
def test_an_unreadable_data_file_is_one_line_naming_it(tmp_path, name):
    content, message = CASES[name]
    (tmp_path / name).write_bytes(content)
    with pytest.raises(UserError, match=message) as err:
        ppl.load_documents(str(tmp_path / name))
    assert str(tmp_path / name) in str(err.value) and "\n" not in str(err.value)


def test_a_directory_is_one_line(tmp_path):
    (tmp_path / "folder.jsonl").mkdir()
    with pytest.raises(UserError, match="folder.jsonl is not a dataset saved by `datasets`"):
        ppl.load_documents(str(tmp_path / "folder.jsonl"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file without read permission")
def test_a_file_without_read_permission_is_one_line(tmp_path):
    (tmp_path / "locked.txt").write_text("text")
    (tmp_path / "locked.txt").chmod(0)
    with pytest.raises(UserError, match="locked.txt: permission denied"):
        ppl.load_documents(str(tmp_path / "locked.txt"))


def test_a_null_text_in_a_saved_dataset_is_refused_not_read_as_none(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["a", None]}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(UserError, match="row 1: its `text` is None, not a string"):
        ppl.load_documents(str(tmp_path / "saved"))


def test_the_command_on_a_latin1_jsonl_prints_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "books.jsonl").write_bytes(CASES["latin1.jsonl"][0])
    out = tmp_path / "out"
    command = [sys.executable, "-m", "evalkit.cli", "ppl", str(TINY), "--lengths", "128"]
    result = subprocess.run(
        [*command, "--data", str(tmp_path / "books.jsonl"), "--out", str(out)], capture_output=True, text=True
    )
    assert result.returncode == 2 and not out.exists(), result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: --data {tmp_path / 'books.jsonl'} line 2: not UTF-8 text (byte 0xe9); save it as UTF-8"
    ]
