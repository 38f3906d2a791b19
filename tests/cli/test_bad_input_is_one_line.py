"""The hostile-input pass over the commands of the last round (ppl, hub names, the bf16 regimes'
--dtype/rope_precision, train --inspect, job arrays, export) kept as a test: each case exits 2 with
one `error:` line and no traceback (docs/reliability.md, fourth round). Run in this process
(tests.helpers.run_cli): a traceback is an exception out of main and fails the case by itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import run_cli
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
