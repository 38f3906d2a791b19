"""Where evalkit keeps files and how it writes them: atomic writes (a reader, or a resumed run,
never sees a half-written file), the lock that keeps one writer per results directory,
replacing only evalkit's own outputs, and the cache directory."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from evalkit.errors import UserError


def cache_root() -> Path:
    """EVALKIT_CACHE, else (unset or empty) ~/.cache/evalkit: the trained tokenizers and RULER samples."""
    return Path(os.environ.get("EVALKIT_CACHE") or Path.home() / ".cache" / "evalkit")  # empty: unset, not "."


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, fsync, then rename over it (mode as open() would give)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with naming(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o666 & ~umask())  # mkstemp creates 0600
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """Errors writing `path` name it: os.write, fsync and libraries (safetensors' StorageFull) raise
    without a file name, and "no space left" alone does not say which disk is full (the cache, or --out)."""
    try:
        yield
    except OSError as err:
        if err.filename is None:
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise
    except Exception as err:
        if disk_full_error(err) is not None:
            raise OSError(errno.ENOSPC, "No space left on device", str(path)) from err
        raise


def disk_full_advice(path: str | Path) -> str:
    """What to free or change when writing `path` found the disk full: the cache is not --out."""
    cache = cache_root().expanduser().resolve()
    target = Path(path).expanduser().resolve()
    if target == cache or cache in target.parents:
        return f"free some space on the disk of the cache {cache}, or set EVALKIT_CACHE to a directory on another disk"
    return "free some space on that disk (or choose another --out)"


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def check_replaceable(destination: Path, is_ours: Callable[[Path], bool], what: str, overwrite: bool) -> None:
    """Refuse, before any work, a destination whose loss the user did not ask for: a file, a symbolic
    link, a non-empty directory evalkit did not write (`is_ours` False), or one it did without
    `overwrite`. `what` names evalkit's own output in the message."""
    destination = Path(destination)
    _check_creatable(destination, destination.parent, "destination")  # written beside it, then renamed into place
    # What a killed earlier writer left goes first: a destination it had set aside is put back,
    # then checked like any other (replaced only with `overwrite`).
    _clean_after_dead_writers(destination)
    if destination.is_symlink():
        raise UserError(f"{destination} is a symbolic link; give the directory it points to, or a new path")
    if destination.exists() and not destination.is_dir():
        raise UserError(f"{destination} is a file; give a directory path (a new or empty one)")
    if not destination.exists() or not any(destination.iterdir()):
        return
    if not is_ours(destination):
        raise UserError(
            f"{destination} exists and is not {what}; evalkit replaces only its own outputs: "
            "give a new or empty directory"
        )
    if not overwrite:
        raise UserError(f"{destination} already holds {what}; pass --overwrite to replace it")


def check_output_dir(directory: Path, option: str = "--out") -> None:
    """Refuse, before any work, an output directory evalkit could not write; creates nothing."""
    directory = Path(directory)
    if _kind(directory, directory, option) == "file":
        raise UserError(f"{option} {directory} is a file, not a directory: choose another {option}")
    _check_creatable(directory, directory, option)


def check_output_file(file: Path, option: str = "--out") -> None:
    """The same for one output file: it may exist (it is replaced), but not as a directory."""
    file = Path(file)
    if _kind(file, file, option) == "dir":
        raise UserError(f"{option} {file} is a directory; give the path of the file to write (in it, or elsewhere)")
    _check_creatable(file, file.parent, option)


def _check_creatable(target: Path, directory: Path, option: str) -> None:
    """`directory` (where `target` goes) exists writable, or can be made: its nearest existing
    ancestor is a writable directory."""
    existing = directory
    while _kind(existing, target, option) is None and existing != existing.parent:
        existing = existing.parent
    if _kind(existing, target, option) == "file":
        raise UserError(f"{option} {target} lies under {existing}, which is a file: choose another {option}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(
            f"{option} {target}: {existing} is not writable (permission denied); choose a writable {option}"
        )


def _kind(path: Path, target: Path, option: str) -> str | None:
    """What `path` is: "dir", "file" or None (absent, or under a file). An unsearchable parent is a
    UserError, where Path.exists() would raise PermissionError."""
    try:
        return "dir" if stat.S_ISDIR(os.stat(path).st_mode) else "file"
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise UserError(f"{option} {target}: cannot reach {path} ({err.strerror}); choose another {option}") from None


def new_directory_beside(destination: Path) -> Path:
    """A fresh hidden directory next to `destination` (same filesystem: a rename moves it in), with
    mkdir's permissions (mkdtemp makes 0700). Its name carries this pid, so a later writer tells a
    killed process's build from one in progress (_clean_after_dead_writers)."""
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    _clean_after_dead_writers(destination)
    tmp = Path(tempfile.mkdtemp(prefix=f".{destination.name}.{os.getpid()}.", suffix=".tmp", dir=destination.parent))
    os.chmod(tmp, 0o777 & ~umask())
    return tmp


def _clean_after_dead_writers(destination: Path) -> None:
    """Undo what a writer of `destination` that died mid-way left beside it: its half-built `.tmp`
    directory is deleted; an earlier destination it had set aside (`.old`, see move_into_place) is
    put back if nothing took its place, else deleted (the new one was in place). Only directories
    whose writer's pid is no longer running are touched, so a live writer's build is left alone."""
    if not destination.parent.is_dir():
        return
    pattern = re.compile(rf"^\.{re.escape(destination.name)}\.(\d+)\.[A-Za-z0-9_]+\.(tmp|old)$")
    for leftover in sorted(destination.parent.iterdir(), key=lambda p: p.name.endswith(".tmp")):  # .old first
        match = pattern.match(leftover.name)
        if not match or not leftover.is_dir() or _process_alive(int(match.group(1))):
            continue
        if match.group(2) == "old" and not (destination.exists() and any(destination.iterdir())):
            if destination.exists():
                destination.rmdir()  # an empty directory where the set-aside one belongs
            leftover.rename(destination)
        else:
            shutil.rmtree(leftover, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0 only asks whether the process exists (this one does)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's live process
    return True


def move_into_place(tmp: Path, destination: Path) -> None:
    """Rename the finished directory `tmp` to `destination`; an earlier one there is set aside
    first and deleted only once the new one is in place, so a kill in between loses neither
    (and the next writer puts a set-aside directory back if the new one never arrived)."""
    if destination.exists() and any(destination.iterdir()):
        old = tmp.with_suffix(".old")
        destination.rename(old)
        try:
            tmp.rename(destination)
        except BaseException:
            old.rename(destination)  # the earlier directory back where it was
            raise
        shutil.rmtree(old)
    else:
        tmp.replace(destination)  # an absent or empty directory


LOCK_NAME = ".evalkit.lock"
# A lock record of another host's run counts as live while anything under the directory was
# written this recently: flock may not reach across the hosts of a shared file system.
OTHER_HOST_QUIET_S = 15 * 60


@contextmanager
def output_lock(directory: Path, *, leave_no_trace: bool = False) -> Iterator[Path]:
    """Hold `directory` as this process's results directory until the block ends (docs/reliability.md,
    "One writer"); yields the lock file. The file stays: unlinking it could let a third process lock a
    new file while a second holds the old one. `leave_no_trace`: a directory this call created that
    holds only the lock when the block fails is removed (a refused run leaves none)."""
    directory = Path(directory)
    created = not directory.exists()
    handle = _open_lock_file(directory)
    record = None
    try:
        _take(handle, directory)
        _refuse_other_host(handle, directory)
        record = _write_record(handle)
        yield directory / LOCK_NAME
    except BaseException:
        if leave_no_trace and created and [p.name for p in directory.iterdir()] == [LOCK_NAME]:
            (directory / LOCK_NAME).unlink()  # while still held: no one else can be writing there
            directory.rmdir()
        raise
    finally:
        if record is not None and _record(handle) == record:  # a clean end: no run holds it now
            handle.truncate(0)
        handle.close()  # closing the last descriptor releases the flock


def _open_lock_file(directory: Path) -> TextIO:
    check_output_dir(directory)  # a file, a path under a file, an unwritable place
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # "a+": create if absent, never truncate (the holder's record is in there).
        return (directory / LOCK_NAME).open("a+", encoding="utf-8")
    except OSError as err:
        raise UserError(f"cannot write in {directory} ({err.strerror}): choose a writable --out") from None


def _take(handle: TextIO, directory: Path) -> None:
    import fcntl  # POSIX only, like the rest of evalkit's process handling

    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = (_record(handle) or {}).get("pid")
        who = f" (pid {pid})" if isinstance(pid, int) else ""
        raise UserError(
            f"another evalkit process{who} is writing to {directory}; wait for it to finish, "
            "or give this run another --out"
        ) from None


def _refuse_other_host(handle: TextIO, directory: Path) -> None:
    """The flock is ours, yet a run on another host may hold the directory (docs/scaling-out.md)."""
    holder = _record(handle)
    if holder is None or holder.get("host") == socket.gethostname():
        return  # on this host the flock decides: a holder alive would have kept it
    quiet = time.time() - _last_write(directory)
    if quiet < OTHER_HOST_QUIET_S:
        raise UserError(
            f"the evalkit run of host {holder.get('host')} pid {holder.get('pid')} (since {holder.get('started')}) "
            f"is writing to {directory} (last write {max(quiet, 0):.0f} s ago); wait for it, or give this run "
            f"another --out (if that run is dead: empty {directory / LOCK_NAME}, or rerun after "
            f"{OTHER_HOST_QUIET_S // 60} quiet minutes)"
        )


def _record(handle: TextIO) -> dict | None:
    handle.seek(0)
    try:
        record = json.loads(handle.read() or "null")
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def _write_record(handle: TextIO) -> dict:
    record = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    handle.truncate(0)
    handle.write(json.dumps(record) + "\n")
    handle.flush()
    return record


def _last_write(directory: Path) -> float:
    newest = 0.0
    for folder, _, files in os.walk(directory):
        for name in [".", *files]:
            try:
                newest = max(newest, os.stat(os.path.join(folder, name)).st_mtime)
            except OSError:
                continue  # removed meanwhile
    return newest


def disk_full_error(err: BaseException) -> BaseException | None:
    """The error in `err`'s chain that says the disk (or quota) is full: an OSError with ENOSPC or
    EDQUOT, or a library's wrapper of one (safetensors reports "StorageFull" in its message)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        full = isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT)
        if full or "StorageFull" in str(current) or "No space left on device" in str(current):
            return current
        current = current.__cause__ or current.__context__
    return None


# What the user can do about a file the system refused (the errno's own words are often obscure).
FILE_ERROR_ADVICE = {
    errno.ELOOP: "a symbolic link loop: fix or remove the link",
    errno.EACCES: "permission denied: make it readable (and its directory searchable), or use another",
    errno.EPERM: "operation not permitted: make it accessible, or use another",
    errno.EISDIR: "a directory where a file was expected: give the file",
    errno.ENOTDIR: "a path under a file: give a directory",
    errno.ENOENT: "no such file (a dangling symbolic link?): restore it, or remove the link",
    errno.ENXIO: "a special file (a socket or FIFO?): give a regular file",
}


def file_error(err: BaseException) -> str | None:
    """One line for an OSError naming a file the system refused, with what to do; None for any other
    error, which stays a traceback (a bug to report)."""
    if not isinstance(err, OSError) or err.filename is None or err.errno not in FILE_ERROR_ADVICE:
        return None
    return f"{err.filename}: {FILE_ERROR_ADVICE[err.errno]} ({err.strerror})"


def refuse_foreign(paths: Iterable[Path], option: str = "--out", heading: str = "") -> None:
    """Before any work: every path among `paths` that exists must be evalkit's (written_by_evalkit).
    `heading`: the first line (a pattern, re.fullmatch) of the caller's markdown among `paths`."""
    for path in paths:
        if path.exists() and not written_by_evalkit(path, heading):
            raise UserError(
                f"{path} is in the way and was not written by evalkit; evalkit never replaces or truncates a file "
                f"it did not write: move it away, or choose another {option}"
            )


def written_by_evalkit(path: Path, heading: str = "") -> bool:
    """Whether `path` looks as evalkit writes it. A JSONL log is not judged by its lines (other
    trainers log {"step", "loss"} too): training's log by its run's marker (train.checkpoint)."""
    try:
        if path.is_dir():
            return (path / "meta.json").is_file() or not any(path.iterdir())
        if path.suffix == ".json":
            record = json.loads(path.read_text(encoding="utf-8"))
            return isinstance(record, dict) and ("provenance" in record or "schema_version" in record)
        if path.suffix == ".md":
            first = path.read_text(encoding="utf-8").partition("\n")[0]
            return bool(heading) and re.fullmatch(heading, first) is not None
        if path.suffix in (".png", ".svg"):
            with open(path, "rb") as handle:
                return b"matplotlib" in handle.read(1 << 16).lower()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return False


def read_text(path: Path, what: str = "") -> str:
    """The UTF-8 text of the user's file `path`, or one line saying why not (`what` says what it was
    given as, e.g. "--config"): not a regular file (a directory, or a FIFO that would block the read
    forever), unreadable (file_error's reasons), or not UTF-8 (naming the line)."""
    named = f"{what} {path}".strip()
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise UserError(f"{named} is not a regular file (a directory, FIFO or device): give a file")
        raw = Path(path).read_bytes()
    except OSError as err:
        raise UserError(f"{named}: {FILE_ERROR_ADVICE.get(err.errno or 0, err.strerror or str(err))}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise UserError(
            f"{named} line {line}: not UTF-8 text (byte 0x{raw[err.start]:02x}); save it as UTF-8"
        ) from None


def jsonl_texts(path: Path, what: str) -> list[str]:
    """The string `text` field of each non-blank line of the user's JSONL file `path` (given as `what`,
    e.g. "--data"), or one line naming the first line that has none."""
    texts = []
    for number, line in enumerate(read_text(path, what).splitlines(), 1):
        if not line.strip():
            continue
        try:
            text = json.loads(line).get("text")
        except (json.JSONDecodeError, AttributeError, RecursionError):  # RecursionError: nested too deep
            text = None
        if not isinstance(text, str):
            raise UserError(f"{what} {path} line {number}: not a JSON object with a string `text` field")
        try:
            text.encode()  # as a hash or a tokenizer will
        except UnicodeEncodeError:
            raise UserError(
                f"{what} {path} line {number}: its `text` holds an unpaired surrogate (\\ud800-\\udfff)"
            ) from None
        texts.append(text)
    return texts


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()  # by hand: hashlib.file_digest is Python 3.11+, evalkit supports 3.10
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_json_object(path: Path) -> dict:
    """The JSON object stored at `path`; {} when it is absent, unreadable, not JSON or not an object
    (to its callers: nothing usable stored there)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}
