"""One writer per results directory on one host: `train` (its run directory), `ruler`, `general`,
`probe` and `quickstart` (their --out) take an flock there and refuse a second process in one line
before writing anything; the kernel drops the lock with its holder, kill -9 included. Across
hosts: tests/sweep/test_one_writer.py."""

import signal
import subprocess
import sys

import pytest

from evalkit.errors import UserError
from evalkit.files import LOCK_NAME, output_lock
from tests.helpers import ROOT, error_line, evalkit
from tests.train.helpers import micro_args

HOLD_LOCK = """
import sys, time
from evalkit.files import output_lock
with output_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(3600)
"""


def test_the_lock_is_freed_when_its_holder_is_killed(tmp_path):
    out = tmp_path / "results"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"  # blocks until the child holds the lock
        refused = rf"another evalkit process \(pid {holder.pid}\) is writing to {out}"
        with pytest.raises(UserError, match=refused), output_lock(out):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert holder.returncode == -signal.SIGKILL
    assert (out / LOCK_NAME).exists()  # the file stays; the kernel dropped the lock with the process
    with output_lock(out) as lock:
        assert lock == out / LOCK_NAME


def test_the_lock_refuses_a_second_holder_in_the_same_process_and_a_file(tmp_path):
    first = output_lock(tmp_path / "out")
    with first, pytest.raises(UserError, match="another evalkit process"), output_lock(tmp_path / "out"):
        pass
    with output_lock(tmp_path / "out"):  # released on leaving the block
        pass
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file"), output_lock(tmp_path / "file"):
        pass


def test_general_refuses_a_directory_another_process_writes(checkpoint, tmp_path):
    out = tmp_path / "general"
    with output_lock(out):
        line = error_line(evalkit("general", "--ckpts", checkpoint, "--tasks", "evalkit_fixture_hellaswag_style",
                                  "--limit", "1", "--out", out))  # fmt: skip
    assert "another evalkit process" in line and str(out) in line
    assert [p.name for p in out.iterdir()] == [LOCK_NAME]  # nothing written


def test_train_refuses_a_run_directory_another_process_trains(tmp_path):
    out = tmp_path / "run"
    with output_lock(out):
        line = error_line(evalkit(*micro_args(out, max_steps=2)))
    assert "another evalkit process" in line and str(out) in line
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # no checkpoint, no metrics
    assert evalkit(*micro_args(out, max_steps=2)).returncode == 0  # once the holder is gone


def test_quickstart_refuses_a_directory_another_process_writes(tmp_path):
    out, runs = tmp_path / "quick", tmp_path / "runs"
    with output_lock(out):
        line = error_line(
            evalkit(
                "quickstart", "--out", out, "--runs", runs, "--recipe", "tiny-cpu", "--max-steps", "1", "--no-shipped"
            )
        )
    assert "another evalkit process" in line and str(out) in line
    assert not runs.exists()  # refused before training


def test_ruler_refuses_a_directory_another_process_writes(checkpoint, tmp_path):
    out = tmp_path / "ruler"
    with output_lock(out):
        result = evalkit("ruler", "--ckpts", checkpoint, "--lengths", "512", "--tasks", "niah_single_1",
                         "--samples", "1", "--out", out)  # fmt: skip
    assert not list(out.rglob("*.jsonl"))  # no sample written beside the holder's
    line = error_line(result)
    assert "another evalkit process" in line and str(out) in line


def test_probe_refuses_a_directory_another_process_writes(checkpoint, tmp_path):
    out = tmp_path / "probe"
    with output_lock(out):
        result = evalkit(
            "probe", "shift", "--ckpt", checkpoint, "--seq", "16", "--n", "1", "--delta1", "0", "--out", out
        )
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # nothing written beside the holder's
    line = error_line(result)
    assert "another evalkit process" in line and str(out) in line
