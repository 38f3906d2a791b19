"""Bad input is one line: a mistaken or hostile argument, file or environment value is refused
before any work with exit 2, one `error:` line, no traceback and nothing written. The hostile-input
pass (ppl, hub names, the bf16 regimes' --dtype/rope_precision, train --inspect, job arrays,
export) runs in this process (tests.helpers.run_cli: a traceback is an exception out of main and
fails the case by itself); counts, lengths, limits and addresses are checked as a user meets them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import error_line, evalkit, evalkit_here, run_cli
from tests.sweep.helpers import SHIPPED_FULL
from tests.test_hub import MAIN, REPO, TINY_BASE, add_snapshot

CKPT = str(TINY_BASE)
PPL = ["ppl", "--ckpts", CKPT, "--lengths", "64"]
SLURM = {"SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_STEP": "1", "SLURM_ARRAY_TASK_COUNT": "4"}
SGE = {"SGE_TASK_FIRST": "1", "SGE_TASK_STEPSIZE": "1", "SGE_TASK_LAST": "4"}

# (command line, environment): {tmp} is the test's directory, where the files below are made.
CASES = {
    # ppl: counts, lengths, dtypes, shards
    "ppl docs 0": ([*PPL, "--docs", "0"], {}),
    "ppl length NaN": (["ppl", "--ckpts", CKPT, "--lengths", "NaN"], {}),
    "ppl length negative": (["ppl", "--ckpts", CKPT, "--lengths", "-64"], {}),
    "ppl length huge": (["ppl", "--ckpts", CKPT, "--lengths", "99999999999999999999999"], {}),
    "ppl length fullwidth digits": (["ppl", "--ckpts", CKPT, "--lengths", "６４"], {}),
    "ppl no lengths": (["ppl", "--ckpts", CKPT, "--lengths", ""], {}),
    "ppl dtype empty": ([*PPL, "--dtype", ""], {}),
    "ppl dtype unknown": ([*PPL, "--dtype", "fp8"], {}),
    "ppl data missing": ([*PPL, "--data", "{tmp}/missing.jsonl"], {}),
    "ppl out is a file": ([*PPL, "--out", "{tmp}/latin1.txt"], {}),
    "ppl shard fullwidth": ([*PPL, "--shard", "３/４"], {}),
    "ppl shard out of range": ([*PPL, "--shard", "4/4"], {}),
    # job arrays: the scheduler's variables, as ASCII digits only
    "slurm fullwidth id": ([*PPL, "--shard", "slurm"], {**SLURM, "SLURM_ARRAY_TASK_ID": "３"}),
    "slurm superscript id": ([*PPL, "--shard", "slurm"], {**SLURM, "SLURM_ARRAY_TASK_ID": "²"}),
    "slurm unset id": ([*PPL, "--shard", "slurm"], SLURM),
    "slurm step 0": ([*PPL, "--shard", "slurm"], {**SLURM, "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_STEP": "0"}),
    "sge arabic-indic id": ([*PPL, "--shard", "sge"], {**SGE, "SGE_TASK_ID": "٣"}),
    # checkpoints and hub names
    "ckpts empty": (["ppl", "--ckpts", "", "--lengths", "64"], {}),
    "hub revision up the tree": (["export", f"{REPO}@../../../x", "{tmp}/out"], {}),
    "hub revision absolute": (["export", f"{REPO}@/etc", "{tmp}/out"], {}),
    "hub double slash": (["ppl", "--ckpts", "someorg//tiny-hub", "--lengths", "64"], {}),
    "hub empty revision": (["probe", "shift", "--ckpt", f"{REPO}@", "--out", "{tmp}/out"], {}),
    "export empty name": (["export", "", "{tmp}/out"], {}),
    "export dtype fp16": (["export", CKPT, "{tmp}/out", "--dtype", "fp16"], {}),
    "export snapshot with a symlink loop": (["export", REPO, "{tmp}/out"], {}),
    # train --inspect, the bf16 regimes, WORLD_SIZE
    "inspect tokens 0": (["train", "--inspect", "{tmp}/inspect", "--inspect-tokens", "0"], {}),
    "inspect windows negative": (["train", "--inspect", "{tmp}/inspect", "--inspect-windows", "-1"], {}),
    "inspect windows huge": (["train", "--inspect", "{tmp}/inspect", "--inspect-windows", "100000000000"], {}),
    "inspect paradigm empty": (["train", "--inspect", "{tmp}/inspect", "--paradigm", ""], {}),
    "train paradigm empty": (["train", "--paradigm", "", "--out", "{tmp}/run"], {}),
    "export to an empty name": (["export", "{tmp}/nowhere", ""], {}),
    "inspect into a file": (["train", "--inspect", "{tmp}/latin1.txt"], {}),
    "inspect seq-len negative": (["train", "--inspect", "{tmp}/inspect", "--seq-len", "-1"], {}),
    "config latin-1 yaml": (["train", "--inspect", "{tmp}/inspect", "--config", "{tmp}/latin1.yaml"], {}),
    "train dtype fp8": (["train", "--inspect", "{tmp}/inspect", "--set", "dtype=fp8"], {}),
    "train rope_precision fp16": (["train", "--inspect", "{tmp}/inspect", "--set", "rope_precision=fp16"], {}),
    "train lr nan": (["train", "--inspect", "{tmp}/inspect", "--set", "optim.lr=nan"], {}),
    "memory gpus 0": (["train", "--memory-estimate", "--gpus", "0"], {}),
    "memory WORLD_SIZE letters": (["train", "--memory-estimate"], {"WORLD_SIZE": "abc"}),
    "memory WORLD_SIZE arabic-indic": (["train", "--memory-estimate"], {"WORLD_SIZE": "٣"}),
    # probe: texts, lengths, lists
    "probe texts latin-1": (["probe", "shift", "--ckpt", CKPT, "--texts", "{tmp}/latin1.txt", "--out", "{tmp}/o"], {}),
    "probe jsonl latin-1": (
        ["probe", "shift", "--ckpt", CKPT, "--texts", "{tmp}/latin1.jsonl", "--out", "{tmp}/o"],
        {},
    ),
    "probe seq negative": (["probe", "shift", "--ckpt", CKPT, "--seq", "-5", "--out", "{tmp}/o"], {}),
    "probe delta1 nan": (["probe", "shift", "--ckpt", CKPT, "--delta1", "nan", "--out", "{tmp}/o"], {}),
}


@pytest.fixture
def hostile(tmp_path, monkeypatch) -> Path:
    """Files as a careless or hostile user hands them over, and an offline hub cache whose snapshot
    holds a symbolic link loop beside the model's files."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("EVALKIT_CACHE", str(tmp_path / "evalkit-cache"))
    for name in [*SLURM, *SGE, "SLURM_ARRAY_TASK_ID", "SGE_TASK_ID", "WORLD_SIZE"]:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "latin1.txt").write_bytes("café au lait. ".encode("latin-1") * 50)
    (tmp_path / "latin1.jsonl").write_bytes('{"text": "café"}\n'.encode("latin-1"))
    (tmp_path / "latin1.yaml").write_bytes("seq_len: 64  # café\n".encode("latin-1"))
    snapshot = add_snapshot(tmp_path / "hub", REPO, MAIN, ("main",))
    os.symlink("loop", snapshot / "loop")
    return tmp_path


@pytest.mark.parametrize("case", CASES)
def test_each_hostile_input_is_one_error_line_and_exit_2(hostile, monkeypatch, capsys, case):
    args, environment = CASES[case]
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    code = run_cli([arg.replace("{tmp}", str(hostile)) for arg in args])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("note:")]
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert not (hostile / "out").exists()  # nothing half-written


def test_environment_values_read_as_meant(monkeypatch):
    """An empty EVALKIT_CACHE is unset (not the working directory); a number may carry spaces."""
    from evalkit.arglists import environ_int
    from evalkit.files import cache_root

    monkeypatch.setenv("EVALKIT_CACHE", "")
    assert cache_root() == Path.home() / ".cache" / "evalkit"
    assert environ_int("WORLD_SIZE", 1, {"WORLD_SIZE": " 4\n"}) == 4
    assert environ_int("WORLD_SIZE", 1, {}) == 1


@pytest.mark.parametrize(
    "lengths, fragment",
    [
        ("²", "could not read length '²'"),  # str.isdigit() says yes, int() says no
        ("１２", "could not read length '１２'"),  # int() would read 12
        ("0", "could not read length '0'"),
        ("-1k", "could not read length '-1k'"),
        ("4k,0", "could not read length '0'"),
        ("", "no lengths given"),
        (" , ", "no lengths given"),
    ],
)
def test_ruler_refuses_unreadable_lengths(checkpoint, lengths, fragment, tmp_path):
    line = error_line(evalkit("ruler", "--ckpts", checkpoint, "--lengths", lengths, "--out", tmp_path / "out"))
    assert fragment in line
    assert not (tmp_path / "out").exists()


def test_quickstart_refuses_empty_lengths_instead_of_using_the_default(tmp_path):
    line = error_line(evalkit("quickstart", "--lengths", "", "--out", tmp_path / "q", "--runs", tmp_path / "runs"))
    assert "no lengths given" in line
    assert not (tmp_path / "q").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", ["ruler", "general", "quickstart"])
def test_last_below_one_is_refused(checkpoint, command, tmp_path):
    out = tmp_path / "out"
    args = {
        "ruler": ["--ckpts", checkpoint, "--lengths", "512", "--tasks", "niah_single_1", "--samples", "1"],
        "general": ["--ckpts", checkpoint, "--tasks", "evalkit_fixture_hellaswag_style", "--limit", "1"],
        "quickstart": ["--runs", tmp_path / "runs", "--recipe", "tiny-cpu", "--max-steps", "1", "--no-shipped"],
    }[command]
    line = error_line(evalkit(command, *args, "--last", "0", "--out", out))
    assert "--last 0" in line and "at least 1" in line
    assert not out.exists() and not (tmp_path / "runs").exists()  # the quickstart trained nothing


@pytest.mark.parametrize("limit", ["inf", "nan", "-1", "0", "2.5"])
def test_general_refuses_a_limit_that_is_no_count_or_fraction(checkpoint, limit, tmp_path):
    out = tmp_path / "out"
    line = error_line(
        evalkit(
            "general",
            "--ckpts",
            checkpoint,
            "--tasks",
            "evalkit_fixture_hellaswag_style",
            "--limit",
            limit,
            "--out",
            out,
        )
    )
    assert "--limit" in line
    assert not out.exists()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["ruler", "--lengths", "512", "--samples", "0"], "--samples and --batch-size must be at least 1"),
        (["ruler", "--lengths", "512", "--batch-size", "0"], "--samples and --batch-size must be at least 1"),
        (["ruler", "--lengths", "512", "--max-length", "0"], "--max-length must be at least 2 tokens"),
        (["ruler", "--lengths", "512", "--max-length", "1"], "--max-length must be at least 2 tokens"),
        (
            ["general", "--tasks", "evalkit_fixture_hellaswag_style", "--max-length", "1"],
            "--max-length must be at least 2",
        ),
        (
            ["general", "--tasks", "evalkit_fixture_hellaswag_style", "--batch-size", "0"],
            "--batch-size must be at least 1",
        ),
        (["quickstart", "--samples", "0"], "--samples must be at least 1"),
        (["probe", "shift", "--n", "0"], "--n: the number of texts must be a positive integer"),
        (["probe", "shift", "--seq", "1"], "--seq: a length must be at least 2 tokens"),
        (["probe", "length", "--lengths", "1"], "--lengths: a length must be at least 2 tokens"),
    ],
)
def test_counts_below_one_are_refused(checkpoint, args, fragment, tmp_path):
    out = tmp_path / "out"
    where = (
        ["--ckpt" if args[0] == "probe" else "--ckpts", checkpoint]
        if args[0] != "quickstart"
        else ["--runs", tmp_path / "runs"]
    )
    line = error_line(evalkit(*args, *where, "--out", out))
    assert fragment in line
    assert not out.exists() and not (tmp_path / "runs").exists()


def test_a_length_beyond_evalkits_limit_names_the_models_window_and_max_length(tmp_path, capsys):
    ckpt = SHIPPED_FULL / "step-600"
    window = json.loads((ckpt / "config.json").read_text())["max_position_embeddings"]
    args = ["ruler", "--ckpts", ckpt, "--tasks", "niah_single_1", "--lengths", "4k,1000000000", "--out", tmp_path]
    line = error_line(evalkit_here(capsys, *args))
    assert f"length 1000000000 is beyond the window of {ckpt} ({window} tokens, its max_position_embeddings)" in line
    assert "--max-length" in line and "evalkit's limit" not in line
    line = error_line(evalkit_here(capsys, *args, "--max-length", "8192"))
    assert "length 1000000000 is beyond --max-length 8192" in line
    assert not list(tmp_path.iterdir())


def test_a_ray_address_without_a_port_is_one_line_saying_the_forms(tmp_path, capsys):
    out = tmp_path / "out"
    ckpt = SHIPPED_FULL / "step-600"
    args = ["ruler", "--ckpts", ckpt, "--tasks", "niah_single_1", "--lengths", "1k", "--samples", "1", "--out", out]
    line = error_line(evalkit_here(capsys, *args, "--executor", "ray", "--ray-address", "nosuchhost"))
    assert "--ray-address 'nosuchhost' is not a Ray address" in line
    assert "HOST:PORT" in line and "ray://HOST:10001" in line and "auto" in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("address", "valid"),
    [
        ("nosuchhost", False),
        ("host:", False),
        ("host:port", False),
        ("http://host:6379", False),
        ("head-node:6379", True),
        ("10.0.0.5:6379", True),
        ("[::1]:6379", True),
        ("ray://head-node:10001", True),
        ("ray://head-node", True),  # Ray Client's default port
        ("auto", True),
    ],
)
def test_ray_address_forms(address, valid):
    from evalkit.cli.options import check_ray_address
    from evalkit.errors import UserError

    if valid:
        check_ray_address(address)
    else:
        with pytest.raises(UserError, match="is not a Ray address"):
            check_ray_address(address)
