"""A disk that fills while training writes (a checkpoint's files, the metrics log) stops the run
in one line saying so, leaves no temporary, and `--resume` after space is freed continues to the
same losses and weights as a run that never stopped."""

import errno
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from evalkit.train import checkpoint as ckpt
from evalkit.train.loop import train
from tests.helpers import error_line, evalkit_here
from tests.train.helpers import losses, micro_args, micro_config

SETS = ("checkpoint.every=2",)


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


class _FullFile:
    """A file on a disk with `room` bytes left: a write beyond raises ENOSPC, as write(2) does."""

    def __init__(self, file, room: int):
        self.file, self.room = file, room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise _enospc()
        self.room -= len(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


def _fill_the_disk(where: str, monkeypatch) -> None:
    """The disk fills at the first write of `where` after step 3 is logged (step 4's save, or the
    log's line for step 4), each library failing as it does on a full disk."""
    real_torch_save, real_open = torch.save, Path.open
    state = {"logged": 0}

    def torch_save(obj, f, *args, **kwargs):
        # torch 2.13 on a full 200 KB tmpfs: given a path, its C++ writer fails with
        # "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534" during handling of
        # "basic_ios::clear: iostream error", no errno anywhere; given a Python file, the same
        # RuntimeError during handling of the file's OSError(ENOSPC) (what _FullFile makes happen).
        if isinstance(f, (str, Path)):
            try:
                raise RuntimeError("basic_ios::clear: iostream error")
            except RuntimeError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534") from None
        return real_torch_save(obj, _FullFile(f, room=1000), *args, **kwargs)

    def safetensors_save(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 100)  # part of it, as far as the disk had room
        # safetensors 0.8 on a full tmpfs raises exactly this
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    def fsync(fd):  # meta.json's atomic write: the kernel reports ENOSPC at fsync
        raise _enospc()

    def open_(self, mode="r", *args, **kwargs):
        file = real_open(self, mode, *args, **kwargs)
        if self.name == "metrics.jsonl" and mode == "a":
            state["logged"] += 1
            if state["logged"] >= 4:
                return _FullFile(file, room=10)
        return file

    if where == "metrics.jsonl":
        monkeypatch.setattr(Path, "open", open_)
        return
    real_write = ckpt.write_checkpoint

    def write_checkpoint(run_dir, step, *args, **kwargs):
        if step < 4:
            return real_write(run_dir, step, *args, **kwargs)
        with monkeypatch.context() as full:
            if where == "trainer_state.pt":
                full.setattr(torch, "save", torch_save)
            elif where == "model.safetensors":
                import safetensors.torch

                full.setattr(safetensors.torch, "save_file", safetensors_save)
            else:
                import evalkit.files

                full.setattr(evalkit.files.os, "fsync", fsync)
            return real_write(run_dir, step, *args, **kwargs)

    monkeypatch.setattr(ckpt, "write_checkpoint", write_checkpoint)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    return train(micro_config(tmp_path_factory.mktemp("straight") / "run", *SETS, max_steps=6), show_progress=False)


@pytest.mark.parametrize("where", ["trainer_state.pt", "model.safetensors", "meta.json", "metrics.jsonl"])
def test_a_full_disk_is_one_line_leaves_no_temporary_and_resume_continues_exactly(
    where, straight, tmp_path, capsys, monkeypatch
):
    run = tmp_path / "run"
    with monkeypatch.context() as full:
        _fill_the_disk(where, full)
        line = error_line(evalkit_here(capsys, *micro_args(run, *SETS, max_steps=6)))
    assert line.startswith("error: no space left on the device writing ") and "--resume" in line, line
    assert f"{run}/" in line and where in line, line
    assert not [p.name for p in run.iterdir() if p.name.startswith(".step-")]
    assert [step for step, _ in ckpt.complete_checkpoints(run)] == [2]
    # space freed: --resume continues from step-2 to the run that never stopped
    result = evalkit_here(capsys, *micro_args(run, *SETS, max_steps=6), "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert losses(run) == losses(straight)
    assert [step for step, _ in ckpt.complete_checkpoints(run)] == [4, 6]
    ours, theirs = (load_file(str(r / "step-6" / "model.safetensors")) for r in (run, straight))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
