"""`evalkit export` never destroys what it did not write: a directory of the user's files or a file
is refused (even with --overwrite), an earlier export is replaced only with --overwrite, and a
failed or killed export leaves nothing behind that the next one does not clean up."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import ROOT, copy_tiny_base, error_line, evalkit, hidden_entries, truncate_weights


@pytest.fixture
def source(tmp_path) -> Path:
    return copy_tiny_base(tmp_path / "src" / "step-7000")


def test_export_refuses_a_directory_holding_the_users_files(source, tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("my notes")
    line = error_line(evalkit("export", source, dest))
    assert str(dest) in line and "not an evalkit checkpoint" in line
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]
    assert (dest / "notes.txt").read_text() == "my notes"
    assert hidden_entries(tmp_path) == []


def test_export_refuses_a_file_even_with_overwrite(source, tmp_path):
    dest = tmp_path / "model.bin"
    dest.write_bytes(b"user data")
    line = error_line(evalkit("export", source, dest, "--overwrite"))
    assert str(dest) in line and "is a file" in line
    assert dest.read_bytes() == b"user data"
    assert hidden_entries(tmp_path) == []


def test_export_replaces_an_earlier_checkpoint_only_with_overwrite(source, tmp_path):
    dest = tmp_path / "shipped"
    assert evalkit("export", source, dest).returncode == 0
    (dest / "left-by-the-first-export.txt").write_text("x")  # tells the two exports apart

    line = error_line(evalkit("export", source, dest, "--dtype", "fp32"))
    assert "--overwrite" in line
    assert (dest / "left-by-the-first-export.txt").exists()
    assert json.loads((dest / "config.json").read_text())["dtype"] == "bfloat16"

    replaced = evalkit("export", source, dest, "--dtype", "fp32", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        p.name for p in source.iterdir() if p.name != "trainer_state.pt"
    )
    assert json.loads((dest / "config.json").read_text())["dtype"] == "float32"
    assert {w.dtype for w in load_file(dest / "model.safetensors").values()} == {torch.float32}
    assert hidden_entries(tmp_path) == []


def test_export_fills_an_empty_directory(source, tmp_path):
    dest = tmp_path / "empty"
    dest.mkdir()
    assert evalkit("export", source, dest).returncode == 0
    assert (dest / "meta.json").read_text() == (source / "meta.json").read_text()
    assert hidden_entries(tmp_path) == []


@pytest.mark.parametrize(
    "damage, fragment",
    [
        (truncate_weights, "model.safetensors is truncated or corrupt"),
        (lambda ckpt: (ckpt / "config.json").write_text('{"model_type": "llama",'), "config.json is not valid JSON"),
    ],
)
def test_a_failed_export_leaves_nothing_behind(source, tmp_path, damage, fragment):
    damage(source)
    dest = tmp_path / "out"
    line = error_line(evalkit("export", source, dest))
    assert fragment in line and str(source) in line
    assert not dest.exists()
    assert hidden_entries(tmp_path) == []


# An export killed with SIGKILL at a chosen moment: after writing part of its copy (in_copy), or
# after setting the earlier destination aside and before moving the new one in (in_swap).
KILLED_EXPORT = """
import os, signal, sys, time
from pathlib import Path
from evalkit.train import checkpoint
from evalkit import files as storage
moment, source, dest = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
write_export, rename = checkpoint._write_export, Path.rename
def write_then_die(*args):
    write_export(*args)
    os.kill(os.getpid(), signal.SIGKILL)
def rename_then_die(self, target):
    moved = rename(self, target)
    if str(target).endswith(".old"):
        os.kill(os.getpid(), signal.SIGKILL)
    return moved
if moment == "in_copy":
    checkpoint._write_export = write_then_die
else:
    Path.rename = rename_then_die
checkpoint.export_checkpoint(source, dest, overwrite=True)
"""


def killed_export(moment: str, source: Path, dest: Path) -> None:
    died = subprocess.run(
        [sys.executable, "-c", KILLED_EXPORT, moment, str(source), str(dest)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]


def test_the_next_export_cleans_what_an_export_killed_mid_copy_left(source, tmp_path):
    dest = tmp_path / "out"
    killed_export("in_copy", source, dest)
    left = hidden_entries(tmp_path)
    assert len(left) == 1 and left[0].startswith(".out.") and left[0].endswith(".tmp")  # what kill -9 leaves
    assert not dest.exists()
    done = evalkit("export", source, dest)
    assert done.returncode == 0, done.stderr
    assert hidden_entries(tmp_path) == [] and (dest / "meta.json").is_file()


def test_an_export_killed_between_set_aside_and_move_in_loses_nothing(source, tmp_path):
    dest = tmp_path / "out"
    assert evalkit("export", source, dest).returncode == 0
    (dest / "left-by-the-first-export.txt").write_text("x")
    killed_export("in_swap", source, dest)
    assert not dest.exists() and len(hidden_entries(tmp_path)) == 2  # the earlier one set aside, the new one built
    # The next writer puts the earlier checkpoint back first, then treats it as any earlier one:
    line = error_line(evalkit("export", source, dest))
    assert "--overwrite" in line
    assert (dest / "left-by-the-first-export.txt").exists() and hidden_entries(tmp_path) == []


def test_a_live_writers_build_is_left_alone(source, tmp_path):
    """Only a dead process's leftovers are cleaned: a build whose pid runs is someone's work in progress."""
    from evalkit.files import new_directory_beside

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        in_progress = tmp_path / f".out.{sleeper.pid}.abcd1234.tmp"
        in_progress.mkdir()
        built = new_directory_beside(tmp_path / "out")
        assert in_progress.is_dir() and built.name.startswith(f".out.{os.getpid()}.")
    finally:
        sleeper.kill()
        sleeper.wait()
    new_directory_beside(tmp_path / "out")
    assert not in_progress.exists()  # its writer is gone now
