"""Training input is checked whole before the first step: every line of a JSONL corpus (JSON,
UTF-8, the text field and its type) and every number of the recipe (--set, --max-steps,
--seq-len), refused in one line naming the file and line or the field; nothing is written."""

import json
from pathlib import Path

import pytest

from evalkit.errors import UserError
from tests.helpers import error_line, evalkit
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)
from tests.train.helpers import micro_args


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def record(text: str = "a few words of a training document " * 4) -> bytes:
    return json.dumps({"text": text, "domain": "web"}).encode()


BAD_JSONL = {
    # case: (the file's lines, the line the error names, what the error says)
    "invalid-json-line-3-of-5": (
        [record(), record(), b'{"text": "cut here', record(), record()],
        3,
        "is not valid JSON",
    ),
    "no-text-field-lines-2-5": ([record(), *[json.dumps({"body": "x"}).encode()] * 4], 2, "has no field 'text'"),
    "not-utf8": ([record(), b'{"text": "caf\xe9"}', record()], 2, "byte 0xe9 at column 14 is not UTF-8"),
    "text-not-a-string": (
        [record(), record(), json.dumps({"text": 7}).encode()],
        3,
        "field 'text' holds a value of type int, not a string",
    ),
    "not-an-object": ([record(), b'["a list"]'], 2, "is a JSON list, not an object"),
}


@pytest.mark.parametrize(
    "case, paradigm",
    [
        *[(case, "anchor") for case in BAD_JSONL],
        ("invalid-json-line-3-of-5", "anchor_tag"),  # reads every line for its domains: a traceback before
    ],
)
def test_a_bad_jsonl_line_is_refused_before_the_first_step(case, paradigm, tmp_path):
    lines, number, fragment = BAD_JSONL[case]
    data = write_lines(tmp_path / "data.jsonl", lines)
    out = tmp_path / "run"
    line = error_line(evalkit(*micro_args(out, f"data.source={data}", paradigm=paradigm, max_steps=5)))
    assert f"{data}, line {number}" in line and fragment in line
    if "field" in fragment:
        assert "data.text_field" in line  # how to point at another field
    assert not out.exists()  # no metrics, no checkpoint


def test_a_jsonl_with_blank_lines_and_a_bom_reads_every_record(tmp_path):
    """The control for the refusals above: what is valid still loads, with its lines counted right."""
    from evalkit.train.data import JsonlSource

    path = write_lines(
        tmp_path / "d.jsonl", [b"\xef\xbb\xbf" + record("one"), b"", record("two"), b"  ", record("three")]
    )
    source = JsonlSource(path, "text", "domain")
    assert [source[i] for i in range(len(source))] == [("one", "web"), ("two", "web"), ("three", "web")]
    assert source.domains() == ["web"]
    path.write_bytes(path.read_bytes().replace(b'"three"', b'"three'))  # changed after opening: still one line
    with pytest.raises(UserError, match=r"d\.jsonl, line 5 is not valid JSON"):
        source[2]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--set", "max_steps=--5"], "max_steps: expected int, got '--5'"),
        (["--set", "optim.lr=-1"], "optim.lr must be at least 0 (0 keeps the weights as they are), got -1.0"),
        (["--set", "optim.lr=nan"], "optim.lr must be a finite number, got nan"),
        (["--set", "optim.weight_decay=inf"], "optim.weight_decay must be a finite number, got inf"),
        (["--set", "optim.beta2=1.5"], "optim.beta1 and optim.beta2 must be in [0, 1)"),
        (["--set", "optim.grad_clip=-1"], "optim.grad_clip must be at least 0"),
        (["--max-steps", "0"], "max_steps must be at least 1, got 0"),
        (["--max-steps", "-3"], "max_steps must be at least 1, got -3"),
        (["--seq-len", "0"], "seq_len must be at least 16, got 0"),
        (["--set", "model.num_heads=3"], "model.hidden_size (256) must be a multiple of model.num_heads (3)"),
    ],
)
def test_train_refuses_bad_numbers_naming_the_field(args, fragment, tmp_path):
    out = tmp_path / "run"
    line = error_line(evalkit("train", "--config", "tiny-cpu", "--out", out, *args))
    assert fragment in line
    assert not out.exists()


def test_a_learning_rate_as_digits_still_reads():
    """The control: the stricter integer and float checks still take what users write."""
    from evalkit.train import load_recipe

    config = load_recipe("tiny-cpu", {"max_steps": 7}, ["optim.lr=2e-5", "seed=+3"])
    assert (config.optim.lr, config.seed, config.max_steps) == (2e-5, 3, 7)
