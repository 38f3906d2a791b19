"""A full disk is one line: ENOSPC or a full quota, from Python's own writes or wrapped by a library
(safetensors' "StorageFull"), ends the command with `error: no space left on the device writing
FILE` and exit 2, naming the file and which disk (the cache's or --out's); other errors stay
tracebacks; an atomic write leaves neither the target nor a temporary file. (While training:
tests/train/test_full_disk_during_training.py.)"""

import errno
import os
from pathlib import Path

import pytest

from tests.helpers import copy_tiny_base, error_line, evalkit_here
from tests.threads import one_torch_thread  # noqa: F401  (an autouse fixture)


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device", "/data/out/ruler-summary.json"),
        RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: ... })"),
        ValueError("could not save"),  # not a full disk: must stay a traceback, not be disguised
    ],
)
def test_a_full_disk_is_one_line_and_other_errors_are_not_hidden(capsys, error):
    import evalkit.cli as cli

    def failing_app():
        raise error

    if isinstance(error, ValueError):
        with pytest.raises(ValueError):
            cli.main(failing_app)
        return
    with pytest.raises(SystemExit) as exited:
        cli.main(failing_app)
    assert exited.value.code == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1 and message.startswith("error: no space left on the device")
    assert ("writing /data/out/ruler-summary.json" in message) == isinstance(error, OSError)


def test_a_write_that_fails_midway_leaves_no_file_behind(tmp_path, monkeypatch):
    """ENOSPC when the data reaches the disk (fsync): neither the target nor a temporary file remains."""
    from evalkit import files as storage

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage.os, "fsync", full_disk)
    with pytest.raises(OSError):
        storage.atomic_write_text(tmp_path / "summary.json", "x" * 10_000)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_names_the_file_and_tells_the_cache_from_out(tmp_path, capsys, monkeypatch):
    """ENOSPC injected where the data reaches the disk (fsync raises it with no file name, as the
    kernel does): the error names the file, and says EVALKIT_CACHE when the full disk was the cache's."""
    cache, out = tmp_path / "cache", tmp_path / "out"
    monkeypatch.setenv("EVALKIT_CACHE", str(cache))
    ckpt = copy_tiny_base(tmp_path / "run" / "step-1")
    args = ["ruler", ckpt, "--tasks", "niah_single_1", "--lengths", "512", "--samples", "1", "--out", out]
    real_fsync = os.fsync

    def full(under: Path):
        def fsync(fd):
            if Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(under):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_fsync(fd)

        return fsync

    monkeypatch.setattr(os, "fsync", full(cache))
    line = error_line(evalkit_here(capsys, *args))
    assert f"no space left on the device writing {cache}/ruler/" in line, line
    assert "EVALKIT_CACHE" in line and "--out" not in line, line

    monkeypatch.setattr(os, "fsync", full(out))  # the cache has room now; --out is full
    line = error_line(evalkit_here(capsys, *args))
    assert f"no space left on the device writing {out}/run/step-1/ruler/niah_single_1/512.jsonl" in line, line
    assert "--out" in line and "EVALKIT_CACHE" not in line, line
