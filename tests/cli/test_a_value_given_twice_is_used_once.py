"""A value given twice is used once: every comma-separated list option is read by one parser that
drops blanks and repeats, and a checkpoint reached twice (a symlinked run beside its target) is
evaluated once, under the first spelling's name."""

import importlib
import json
import shutil

import pytest

from tests.helpers import copy_tiny_base, error_line, evalkit_here
from tests.sweep.helpers import SHIPPED_FULL
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)


def test_a_length_or_task_given_twice_is_scored_and_stored_once(tmp_path, capsys):
    ckpt = copy_tiny_base(tmp_path / "run" / "step-1")
    out = tmp_path / "out"
    twice = ["--tasks", "niah_single_1, niah_single_1", "--lengths", "512, 512,512", "--samples", "1"]
    assert evalkit_here(capsys, "ruler", ckpt, *twice, "--out", out).returncode == 0
    summary = json.loads((out / "run" / "step-1" / "ruler-summary.json").read_text())
    assert [(row["task"], row["length"]) for row in summary["rows"]] == [("niah_single_1", 512)]
    assert summary["provenance"]["settings"]["lengths"] == [512]
    assert summary["provenance"]["settings"]["tasks"] == ["niah_single_1"]
    samples = out / "run" / "step-1" / "ruler" / "niah_single_1" / "512.jsonl"
    assert len(samples.read_text().splitlines()) == 1
    result = evalkit_here(capsys, "leaderboard", out, "--out", tmp_path / "board.md")
    assert result.returncode == 0, result.stderr  # once, not "holds niah_single_1 512 twice"


@pytest.mark.parametrize(
    "parse, given, expected",
    [
        ("evalkit.lengths:parse_lengths", "4k,4096,,8k,4k", [4096, 8192]),
        ("evalkit.ruler.runner:parse_ruler_tasks", "vt,niah_single_1,vt", ["vt", "niah_single_1"]),
        ("evalkit.arglists:parse_list", "mmlu,hellaswag,mmlu", ["mmlu", "hellaswag"]),  # evalkit general --tasks
        ("perf.eval:parse_engines", "hf, hf", ["hf"]),
    ],
)
def test_every_list_parser_keeps_each_value_once(parse, given, expected):
    module, name = parse.split(":")
    assert getattr(importlib.import_module(module), name)(given) == expected


def test_paradigms_and_dtypes_given_twice_are_used_once(tmp_path, capsys):
    from evalkit.probe.options import ProbeOptions

    assert ProbeOptions(dtypes="fp32,FP32,bf16", delta1="0,0,2").dtypes == ("fp32", "bf16")
    args = ["quickstart", "--paradigms", "full,full", "--max-steps", "-1", "--out", tmp_path / "q"]
    assert "--max-steps" in error_line(evalkit_here(capsys, *args))  # parsed (no error on full,full) first


def test_a_symlinked_run_beside_its_target_is_evaluated_once(tmp_path, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(SHIPPED_FULL / "step-600", runs / "myrun" / "step-600")
    (runs / "latest").symlink_to("myrun")
    out = tmp_path / "out"
    args = ["ruler", "--ckpts", f"{runs}/*/", "--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1"]
    result = evalkit_here(capsys, *args, "--out", out)
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "same checkpoint directory" in line]
    # glob order: runs/latest comes first and keeps its name; myrun is the spelling skipped
    assert notes == [
        "note: myrun (step 600) is the same checkpoint directory as latest (a symlink?): "
        "skipped, evaluated once as latest"
    ]
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/step-*/ruler-summary.json")) == [
        "latest/step-600/ruler-summary.json"
    ]
