"""--engine-arg KEY=VALUE: any engine setting from `evalkit ruler` and `evalkit general`, checked in one line."""

import json
import subprocess
import sys

import pytest

from evalkit.engines.args import OWN_FLAGS, engine_setting_types, parse_engine_args
from evalkit.errors import UserError
from tests.helpers import build_checkpoint, error_line, evalkit_here


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


@pytest.mark.parametrize("value", ["sdpa=1", "no_such_kernel", "evalkit_sdpa"])
def test_a_bad_attention_setting_is_one_line_before_any_checkpoint(tmp_path, capsys, value):
    from tests.sweep.helpers import SHIPPED_FULL

    out = tmp_path / "out"
    run = SHIPPED_FULL  # two checkpoints: neither may be recorded as failed
    args = ["ruler", "--ckpts", run, "--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1", "--out", out]
    line = error_line(evalkit_here(capsys, *args, "--engine-arg", f"attention={value}"))
    assert f"got {value!r}" in line or f"attention={value!r}" in line
    assert "sdpa" in line and "eager" in line  # what to use instead
    assert not out.exists()  # no ruler-failed.json, nothing at all


@pytest.mark.parametrize("value", ["sdpa", "eager"])
def test_transformers_attention_names_pass_the_check(value):
    from evalkit.engines import check_engine_settings

    check_engine_settings("hf", {"attention": value, "batch_size": 2})


def test_a_missing_engine_package_is_one_line_before_any_checkpoint(tmp_path, capsys):
    import importlib.util

    from tests.sweep.helpers import SHIPPED_FULL

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the message is for environments without it")
    out = tmp_path / "out"
    run = SHIPPED_FULL  # two checkpoints: neither may be recorded as failed
    args = ["ruler", "--ckpts", run, "--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1", "--out", out]
    line = error_line(evalkit_here(capsys, *args, "--engine", "vllm"))
    assert line.startswith("error: the vllm engine needs vllm, which is not installed: pip install")
    assert not out.exists()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rope": "sideways"}, "rope must be one of"),
        ({"position_shift": -1}, "position_shift must be non-negative, got -1"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be at least 1, got 0"),
    ],
)
def test_the_vllm_engine_judges_its_settings_without_a_checkpoint(settings, message):
    """What check_engine_settings asks the vllm engine before a sweep (vLLM itself is not needed)."""
    from evalkit.engines.vllm import VLLMEngine
    from evalkit.errors import UserError

    VLLMEngine.check_settings({"rope": "cast", "position_shift": 0, "batch_size": 4})  # its defaults pass
    with pytest.raises(UserError, match=message):
        VLLMEngine.check_settings(settings)
