"""--engine-arg KEY=VALUE: any engine setting from `evalkit ruler` and `evalkit general`, checked in one line."""

import json
import subprocess
import sys

import pytest

from evalkit.engines.args import OWN_FLAGS, engine_setting_types, parse_engine_args
from evalkit.errors import UserError
from tests.helpers import build_checkpoint


def test_every_keyword_setting_of_the_engine_is_reachable_with_its_type():
    types = engine_setting_types("hf")
    assert {"device", "attention", "packed_attention", "prefill", "threads", "trust_remote_code"} <= set(types)
    assert "model_path" not in types  # positional: the checkpoint, not a setting
    parsed = parse_engine_args(
        "hf", ["prefill=padded", "threads=3", "trust-remote-code=false", "device=cpu"], OWN_FLAGS
    )
    assert parsed == {"prefill": "padded", "threads": 3, "trust_remote_code": False, "device": "cpu"}
    assert parse_engine_args("hf", ["threads=none"], OWN_FLAGS) == {"threads": None}  # int | None
    assert parse_engine_args("hf", None, OWN_FLAGS) == {}


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("prefil=padded", "the hf engine has no setting 'prefil'; its settings: device, attention"),
        ("threads=two", "--engine-arg threads: expected int or none, got 'two'"),
        ("trust_remote_code=maybe", "--engine-arg trust_remote_code: expected bool, got 'maybe'"),
        ("threads", "expected KEY=VALUE"),
        ("batch_size=4", "--engine-arg batch_size: this command sets it with --batch-size"),
    ],
)
def test_a_wrong_key_or_type_is_one_line_naming_it(assignment, message):
    with pytest.raises(UserError) as raised:
        parse_engine_args("hf", [assignment], OWN_FLAGS)
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer):
    """A tiny checkpoint whose window holds RULER at 512 tokens."""
    path = tmp_path_factory.mktemp("tiny") / "step-1"
    build_checkpoint(path, tokenizer, max_position_embeddings=1024)
    return path


def evalkit(*args):
    command = [sys.executable, "-m", "evalkit.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def only_summary(out, name):
    (path,) = out.rglob(f"{name}-summary.json")
    return json.loads(path.read_text())


def test_ruler_passes_engine_args_to_the_engine_and_records_them(checkpoint, tmp_path):
    out = tmp_path / "ruler"
    result = evalkit("ruler", "--ckpts", str(checkpoint), "--tasks", "niah_single_1", "--lengths", "512",
                     "--samples", "2", "--engine-arg", "prefill=padded", "--engine-arg", "threads=1",
                     "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    provenance = only_summary(out, "ruler")["provenance"]
    assert provenance["settings"]["engine_args"] == {"prefill": "padded", "threads": 1}
    assert provenance["command"] == f"evalkit ruler --ckpts {checkpoint} --tasks niah_single_1 --lengths 512 " + (
        f"--samples 2 --engine-arg prefill=padded --engine-arg threads=1 --out {out}"
    )  # every summary records its command
    assert (provenance["engine"]["prefill"], provenance["engine"]["threads"]) == (
        "padded",
        1,
    )  # the engine's own record


def test_general_passes_engine_args_to_the_engine_and_records_them(checkpoint, tmp_path):
    out = tmp_path / "general"
    result = evalkit("general", "--ckpts", str(checkpoint), "--tasks", "evalkit_fixture_hellaswag_style",
                     "--limit", "2", "--engine-arg", "prefill=padded", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    provenance = only_summary(out, "general")["provenance"]
    assert provenance["engine"]["prefill"] == "padded"
    assert provenance["command"].startswith(f"evalkit general --ckpts {checkpoint} --tasks evalkit_fixture_hellaswag")


def test_a_bad_engine_arg_stops_the_command_in_one_line_before_any_work(checkpoint, tmp_path):
    result = evalkit("ruler", "--ckpts", str(checkpoint), "--engine-arg", "threads=two", "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "error: --engine-arg threads: expected int or none, got 'two'"
    assert not (tmp_path / "o").exists()
