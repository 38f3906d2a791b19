"""Nothing of the user's is replaced: before any work, each command refuses an --out under a file,
that is a file (or, for the leaderboard, a directory) or in a directory it cannot write, and each
file it would replace (train's metrics.jsonl and step-N, summaries, failure records, --avg tables,
probe outputs, the leaderboard) must be one evalkit wrote, recognised by its content; otherwise
one line names it and nothing changes."""

import json
import os
from pathlib import Path

import pytest

from evalkit.errors import UserError
from tests.helpers import (
    copy_tiny_base,
    error_line,
    evalkit,
    evalkit_here,
    hidden_entries,
    ruler_summary,
    write_summary,
)
from tests.train.helpers import micro_args


def out_commands(checkpoint: Path, tmp_path: Path) -> dict[str, list]:
    """Each command that takes --out, with arguments it would otherwise run with."""
    results = tmp_path / "results"
    (results / "run" / "step-1").mkdir(parents=True)  # an (empty) results directory for the leaderboard
    return {
        "train": ["train", "--config", "tiny-cpu", "--max-steps", "1"],
        "ruler": ["ruler", "--ckpts", checkpoint, "--lengths", "512", "--tasks", "niah_single_1", "--samples", "1"],
        "general": ["general", "--ckpts", checkpoint, "--tasks", "evalkit_fixture_hellaswag_style", "--limit", "1"],
        "probe": ["probe", "shift", "--ckpt", checkpoint, "--seq", "16", "--n", "1", "--delta1", "0"],
        "leaderboard": ["leaderboard", results],
    }


OUT_COMMANDS = ["train", "ruler", "general", "probe", "leaderboard"]


@pytest.mark.parametrize("command", OUT_COMMANDS)
def test_out_under_a_file_is_refused_before_any_work(checkpoint, command, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("mine")
    out = blocker / "out" / ("board.md" if command == "leaderboard" else "")
    line = error_line(evalkit(*out_commands(checkpoint, tmp_path)[command], "--out", out))
    assert f"lies under {blocker}, which is a file" in line
    assert blocker.read_text() == "mine"
    assert hidden_entries(tmp_path) == []


@pytest.mark.parametrize("command", [c for c in OUT_COMMANDS if c != "leaderboard"])
def test_out_that_is_a_file_is_refused_before_any_work(checkpoint, command, tmp_path):
    out = tmp_path / "a-file"
    out.write_text("mine")
    line = error_line(evalkit(*out_commands(checkpoint, tmp_path)[command], "--out", out))
    assert f"{out} is a file" in line
    assert out.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "results"]


def test_leaderboard_out_that_is_a_directory_is_refused(checkpoint, tmp_path):
    args = out_commands(checkpoint, tmp_path)["leaderboard"]
    line = error_line(evalkit(*args, "--out", tmp_path))
    assert f"{tmp_path} is a directory" in line
    assert not (tmp_path / "plots").exists()


@pytest.mark.parametrize("command", OUT_COMMANDS)
def test_out_in_an_unwritable_directory_is_refused_before_any_work(checkpoint, command, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root (with CAP_DAC_OVERRIDE) writes anywhere
            pytest.skip(f"a 0o500 directory stays writable for this user (euid {os.geteuid()}, e.g. root)")
        out = locked / ("board.md" if command == "leaderboard" else "out")
        line = error_line(evalkit(*out_commands(checkpoint, tmp_path)[command], "--out", out))
        assert f"{locked} is not writable" in line
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


def test_an_unwritable_output_directory_is_refused_without_running_as_another_user(tmp_path, monkeypatch):
    """The permission branch, for machines where the test above is skipped (root writes anywhere)."""
    from evalkit.files import check_output_dir, check_output_file

    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(UserError, match=f"--out {tmp_path / 'new' / 'out'}: {tmp_path} is not writable"):
        check_output_dir(tmp_path / "new" / "out")
    with pytest.raises(UserError, match=f"--out {tmp_path / 'board.md'}: {tmp_path} is not writable"):
        check_output_file(tmp_path / "board.md")
    (tmp_path / "sub").mkdir()
    check_output_dir(tmp_path / "sub" / "out")  # a writable place: accepted


def test_train_refuses_a_metrics_log_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("my own notes, line 1\nline 2\n")
    (out / "step-9").mkdir()
    (out / "step-9" / "weights.bin").write_bytes(b"mine")
    line = error_line(evalkit_here(capsys, "train", "--config", "tiny-cpu", "--max-steps", "1", "--out", out))
    assert str(out / "metrics.jsonl") in line and "not written by evalkit" in line, line
    assert (out / "metrics.jsonl").read_text() == "my own notes, line 1\nline 2\n"
    (out / "metrics.jsonl").unlink()
    line = error_line(evalkit_here(capsys, "train", "--config", "tiny-cpu", "--max-steps", "1", "--out", out))
    assert str(out / "step-9") in line and "not written by evalkit" in line, line
    assert (out / "step-9" / "weights.bin").read_bytes() == b"mine"
    assert sorted(p.name for p in out.iterdir()) == ["step-9"]  # nothing written: refused before any work


FOREIGN = {  # (command's output file, relative to --out) -> its arguments after the checkpoint
    "ruler summary": ("run/step-1/ruler-summary.json", "ruler"),
    "ruler failure record": ("run/step-1/ruler-failed.json", "ruler"),
    "ruler --avg table": ("ruler-avg.md", "ruler"),
    "probe markdown": ("probe-shift.md", "probe"),
    "probe figure": ("probe-shift.png", "probe"),
}


@pytest.mark.parametrize("case", list(FOREIGN))
def test_an_output_file_of_the_users_is_refused_before_any_work(case, tmp_path, capsys):
    name, command = FOREIGN[case]
    ckpt = copy_tiny_base(tmp_path / "run" / "step-1")
    out = tmp_path / "out"
    (out / name).parent.mkdir(parents=True)
    (out / name).write_text('{"mine": true}' if name.endswith(".json") else "# my notes\n")
    if command == "ruler":
        args = ["ruler", ckpt, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1", "--avg"]
    else:
        args = ["probe", "shift", "--ckpt", ckpt, "--seq", "16", "--n", "1", "--delta1", "0"]
    line = error_line(evalkit_here(capsys, *args, "--out", out))
    assert str(out / name) in line and "not written by evalkit" in line, line
    assert (out / name).read_text() in ('{"mine": true}', "# my notes\n")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [name]


def test_the_leaderboard_never_replaces_a_markdown_file_of_the_users(tmp_path, capsys):
    results = tmp_path / "results"
    write_summary(results, ruler_summary("current", 61.0))
    notes = tmp_path / "notes.md"
    notes.write_text("# My notes\n")
    line = error_line(evalkit_here(capsys, "leaderboard", results, "--out", notes))
    assert str(notes) in line and "not written by evalkit" in line
    assert notes.read_text() == "# My notes\n"
    board = tmp_path / "board.md"
    assert evalkit_here(capsys, "leaderboard", results, "--out", board).returncode == 0
    assert evalkit_here(capsys, "leaderboard", results, "--out", board).returncode == 0  # its own: replaced


def test_quickstart_refuses_a_leaderboard_of_the_users_before_training(tmp_path, capsys):
    out = tmp_path / "q"
    out.mkdir()
    (out / "leaderboard.md").write_text("# my notes\n")
    line = error_line(evalkit_here(capsys, "quickstart", "--out", out, "--runs", tmp_path / "runs"))
    assert str(out / "leaderboard.md") in line and "not written by evalkit" in line, line
    assert [p.name for p in out.iterdir()] == ["leaderboard.md"] and not (tmp_path / "runs").exists()


OTHER_TRAINERS_LOGS = {
    # HF Trainer's log_history entries, as its callbacks write them one per line
    "hf-trainer": [
        {"loss": 2.3046, "grad_norm": 1.8125, "learning_rate": 4.9e-05, "epoch": 0.01, "step": 10},
        {"loss": 2.1187, "grad_norm": 1.6875, "learning_rate": 4.8e-05, "epoch": 0.02, "step": 20},
    ],
    # torchtitan's metrics, as a JSONL logger of its metric names would write them
    "torchtitan": [
        {
            "step": 10,
            "loss_metrics/global_avg_loss": 7.81,
            "loss_metrics/global_max_loss": 7.95,
            "throughput(tps)": 8123.4,
            "memory/max_reserved(GiB)": 21.3,
        },
        {
            "step": 20,
            "loss_metrics/global_avg_loss": 6.92,
            "loss_metrics/global_max_loss": 7.1,
            "throughput(tps)": 8201.0,
            "memory/max_reserved(GiB)": 21.3,
        },
    ],  # fmt: skip
    "plain": [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.4}],
}


@pytest.mark.parametrize("trainer", list(OTHER_TRAINERS_LOGS))
@pytest.mark.parametrize("resume", [False, True])
def test_another_trainers_metrics_log_is_refused_and_left_as_it_is(tmp_path, capsys, trainer, resume):
    out = tmp_path / "run"
    out.mkdir()
    text = "".join(json.dumps(record) + "\n" for record in OTHER_TRAINERS_LOGS[trainer])
    (out / "metrics.jsonl").write_text(text)
    line = error_line(evalkit_here(capsys, *micro_args(out, max_steps=2), *(["--resume"] if resume else [])))
    assert str(out / "metrics.jsonl") in line and "not written by evalkit" in line, line
    assert (out / "metrics.jsonl").read_text() == text
    assert [p.name for p in out.iterdir()] == ["metrics.jsonl"]  # nothing written
