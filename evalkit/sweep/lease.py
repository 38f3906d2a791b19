"""One writer per results directory and per group of units across hosts, without flock.

flock (and NFS byte-range locks) cannot be trusted across hosts on many shared file systems, so
this module relies only on operations that NFSv3+ and every local file system make atomic:
creating a name with link(2) or O_CREAT|O_EXCL (exactly one creator of a name succeeds; a lease is
linked in whole, so it is never seen half-written) and rename over an existing file (a reader sees
the old or the new content, never a mix). It never compares the clocks of two hosts: a holder
proves it lives by a counter it raises every `timeout / 4` seconds, and an observer declares it
dead when the counter stays unchanged for `timeout` seconds on the observer's own monotonic clock.

    <out>/.evalkit-lease/driver-<g>.lease               generation g of the driver lease: host, pid,
                                                        since, beats (raised by the holder), released
    <out>/.evalkit-lease/g<g>/<group>/claim-<a>.lease   attempt a of a group's claim under driver g

The driver lease: the holder is the newest generation. A newcomer takes generation g+1 (O_EXCL:
one winner among racing newcomers) only when generation g is released, or its holder is dead:
on the same host (same host name and boot id) a pid that no longer runs is dead at once; on
another host, a counter unchanged for `timeout` seconds. While the holder lives the newcomer is
refused with one line naming it.

A group's claim: a worker evaluating a group creates attempt a+1 (O_EXCL) and may write the
group's files only while its attempt is the newest and its driver's generation is the newest:
`check()` before every durable write (storage.fenced) stops a worker whose group was claimed
again (its node cut off, its process paused) before it writes another line. What remains is the
moment between `check()` and the write: a worker paused exactly there can still append one
batch of complete records after its replacement started. Those are records of the same samples
from the same data, and the sample log's reader keeps the first record of each sample index:
nothing is counted twice and nothing is lost (the replacement computes every sample it did not
find in the log). Summaries are written only by the driver, fenced by its own lease; a driver
paused in the same instant can replace a summary once more, with one computed from the same logs.

Assumed of the shared file system: link, O_EXCL creation and rename are atomic (local file systems,
NFSv3 and later, Lustre, GPFS, CephFS), and listing a directory or opening a file shows what
other hosts created or renamed there (NFS close-to-open consistency). Appends of two hosts to
one file are not atomic on NFS; only the instant above could make two hosts append at once.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from evalkit.errors import UserError
from evalkit.files import atomic_write_json, fenced, naming

LEASE_DIR = ".evalkit-lease"
TIMEOUT_ENV = "EVALKIT_LEASE_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
_DRIVER = re.compile(r"^driver-(\d+)\.lease$")
_CLAIM = re.compile(r"^claim-(\d+)\.lease$")
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}  # what link(2) says on such file systems


class LeaseLost(UserError):
    """This process no longer holds the lease (or claim) it writes under: it must stop writing."""


def lease_timeout() -> float:
    """Seconds without a renewal after which a holder on another host is taken for dead."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise UserError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


def host_identity() -> dict[str, str]:
    """This host's name, boot id and pid namespace: a pid names the same process only where all
    three agree (two containers of one kernel share the boot id, not the pid namespace)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        boot = namespace = ""
    return {"host": socket.gethostname(), "boot_id": boot, "pid_ns": namespace}


def _numbered(directory: Path, pattern: re.Pattern) -> list[int]:
    """The numbers of `directory`'s files matching `pattern`; listing revalidates the directory
    on NFS (close-to-open), where a lookup of one name could be answered from a stale cache."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(pattern.match, names) if m)


def _create_exclusive(path: Path, record: dict[str, Any]) -> bool:
    """Create `path` holding the whole of `record`; False when it exists already (another creator won).

    The record is written to a private name first and linked to `path` (link(2) fails on an existing
    name, like O_EXCL): `path` never exists half-written, so a racing newcomer never reads an empty
    lease and never mistakes a holder being born for one that stopped renewing. Where the file system
    has no hard links, O_EXCL creation (a short window where the name is empty; readers wait it out).
    Not fsynced: the creation is what counts, and a host that crashes ends its holder anyway."""
    with naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        private = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}")
        _write_record(private, record)
        try:
            return _link(private, path)
        except OSError as error:
            if error.errno not in _NO_HARD_LINKS:
                raise
            return _create_with_o_excl(path, record)
        finally:
            private.unlink(missing_ok=True)


def _write_record(path: Path, record: dict[str, Any]) -> None:
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")


def _link(private: Path, path: Path) -> bool:
    try:
        os.link(private, path)
    except FileExistsError:
        # NFS: a retried link whose first reply was lost says "exists" though it made the link;
        # the private file's link count tells (2: this link is ours).
        return os.stat(private).st_nlink == 2
    return True


def _create_with_o_excl(path: Path, record: dict[str, Any]) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    return True


def _read(path: Path) -> dict[str, Any] | None:
    """A lease record, or None while its creator is still writing it (or it is gone)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if _well_formed(record) else None


def _read_once_written(path: Path, grace: float) -> dict[str, Any] | None:
    """`_read`, waiting up to `grace` s for a record being written (O_EXCL creation's empty moment)."""
    deadline = time.monotonic() + grace
    while (record := _read(path)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return record


def _well_formed(record: Any) -> bool:
    """A record this module could have written: one edited or damaged into other types reads as
    unreadable (watched for the timeout, then taken over), never as a crash."""
    if not isinstance(record, dict):
        return False
    pid, started = record.get("pid", 0), record.get("started")
    return (
        isinstance(pid, int)
        and not isinstance(pid, bool)
        and (started is None or (isinstance(started, int) and not isinstance(started, bool)))
    )


def _pid_runs(pid: int, started: int | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return started is None or _process_start(pid) in (None, started)  # a reused pid is another process


def _process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class _Beating:
    """A lease file this process holds and renews from a thread: `beats` raised every timeout/4 s.
    The renewal stops (and `lost` is set) once `still_mine()` says another holder took over."""

    def __init__(self, path: Path, record: dict[str, Any], timeout: float, still_mine: Callable[[], bool]) -> None:
        self.path, self.record, self.timeout, self.still_mine = path, record, timeout, still_mine
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"lease:{path.name}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.timeout / 4):
            try:
                if not self.still_mine():
                    self.lost.set()
                    return
                self.record["beats"] += 1
                atomic_write_json(self.path, self.record)
            except OSError:
                continue  # a passing error of the shared file system: the next renewal tries again

    def stop(self, **final: Any) -> None:
        self._stop.set()
        self._thread.join()
        if final and not self.lost.is_set() and self.still_mine():
            try:
                atomic_write_json(self.path, {**self.record, **final})
            except OSError:
                pass  # (a full disk) left unreleased: taken over as a dead holder's, not to mask the error


class DriverLease:
    """Generation `generation` of the driver lease on `out`, held by this process."""

    def __init__(self, out: Path, generation: int, record: dict[str, Any], timeout: float) -> None:
        self.out, self.generation, self.timeout = Path(out), generation, timeout
        path = self.directory / f"driver-{generation}.lease"
        self._beating = _Beating(path, record, timeout, lambda: self.newest() == generation)

    @property
    def directory(self) -> Path:
        return self.out / LEASE_DIR

    def newest(self) -> int:
        return max(_numbered(self.directory, _DRIVER), default=0)

    def check(self) -> None:
        """Raise LeaseLost when a newer driver took over `out` (this one stopped renewing in time)."""
        newest = self.newest()
        if newest != self.generation:
            holder = _read(self.directory / f"driver-{newest}.lease") or {}
            raise LeaseLost(
                f"{describe(holder)} took over {self.out} after this run renewed no lease for "
                f"{self.timeout:g} s (paused or cut off); this run stops without writing more "
                "(what it stored is kept)"
            )

    def release(self) -> None:
        self._beating.stop(released=True)
        shutil.rmtree(self.directory / f"g{self.generation}", ignore_errors=True)  # the groups' claims


def describe(holder: dict[str, Any]) -> str:
    since = f" since {holder['since']}" if holder.get("since") else ""
    return f"the evalkit run of host {holder.get('host', '?')} pid {holder.get('pid', '?')}{since}"


def acquire_driver_lease(out: Path, timeout: float | None = None, log: Callable[[str], None] = print) -> DriverLease:
    """Take the driver lease on `out`, or refuse with one line naming its live holder."""
    timeout = lease_timeout() if timeout is None else timeout
    directory = Path(out) / LEASE_DIR
    while True:
        newest = max(_numbered(directory, _DRIVER), default=0)
        if newest and not _taken_over_possible(directory / f"driver-{newest}.lease", timeout, log, out):
            holder = _read(directory / f"driver-{newest}.lease") or {}
            raise UserError(
                f"{describe(holder)} is writing to {out} (its lease is renewed); wait for it to finish, "
                "or give this run another --out"
            )
        record = {**host_identity(), "pid": os.getpid(), "started": _process_start(os.getpid())}
        record.update(since=time.strftime("%Y-%m-%d %H:%M:%S %Z"), beats=0, released=False)
        generation = newest + 1
        if not _create_exclusive(directory / f"driver-{generation}.lease", record):
            continue  # another newcomer took this generation first: judge that holder instead
        if max(_numbered(directory, _DRIVER)) != generation:  # a slow newcomer's number, pruned and passed
            (directory / f"driver-{generation}.lease").unlink(missing_ok=True)
            continue
        for older in _numbered(directory, _DRIVER):
            if older < generation:  # only ever older ones: the newest decides who holds the lease
                (directory / f"driver-{older}.lease").unlink(missing_ok=True)
                shutil.rmtree(directory / f"g{older}", ignore_errors=True)  # its workers are fenced by generation
        return DriverLease(Path(out), generation, record, timeout)


def _taken_over_possible(path: Path, timeout: float, log: Callable[[str], None], out: Path) -> bool:
    """Whether the lease in `path` is free: released, or its holder dead (see the module docstring)."""
    holder = _read_once_written(path, grace=min(1.0, timeout / 8))
    if holder is not None and holder.get("released"):
        return True
    me = host_identity()
    if holder is not None and all(holder.get(key) == value for key, value in me.items()):
        return not _pid_runs(int(holder.get("pid", 0)), holder.get("started"))
    log(
        f"{out}: {describe(holder or {})} held its lease; watching for up to {timeout:g} s "
        f"whether it renews it ({TIMEOUT_ENV})"
    )
    return not _renewed_within(path, holder, timeout)


def _renewed_within(path: Path, seen: dict[str, Any] | None, timeout: float) -> bool:
    """Whether the record at `path` changes (renewed, released, or written at last) within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(min(0.5, timeout / 8))
        now = _read(path)
        if now is not None and now != seen:
            return not now.get("released")
    return False


@contextmanager
def driver_lease(out: Path, log: Callable[[str], None] = print) -> Iterator[DriverLease]:
    """Hold the driver lease on `out` for the block; every durable write in it is fenced by it."""
    lease = acquire_driver_lease(out, log=log)
    try:
        with fenced(lease.check):
            yield lease
    finally:
        lease.release()


def group_key(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]


class GroupClaim:
    """Attempt `attempt` of a group's claim under driver generation `generation`, held by a worker."""

    def __init__(self, out: Path, generation: int, group: str, attempt: int, beating: _Beating | None) -> None:
        self.out, self.generation, self.group, self.attempt = Path(out), generation, group, attempt
        self._beating = beating

    @property
    def directory(self) -> Path:
        return claims_dir(self.out, self.generation, self.group)

    def holds(self) -> bool:
        driver = max(_numbered(self.out / LEASE_DIR, _DRIVER), default=0)
        return driver == self.generation and max(_numbered(self.directory, _CLAIM), default=0) == self.attempt

    def check(self) -> None:
        """Raise LeaseLost when the group was claimed again (or its driver replaced): write nothing more."""
        if not self.holds():
            raise LeaseLost(
                f"{self.group}: attempt {self.attempt} was superseded (its worker renewed no claim in time); "
                "this worker stops without writing more"
            )

    def stop(self) -> None:
        if self._beating is not None:
            self._beating.stop()


def claims_dir(out: Path, generation: int, group: str) -> Path:
    return Path(out) / LEASE_DIR / f"g{generation}" / group_key(group)


def claim_group(out: Path, generation: int, group: str, timeout: float, worker: dict[str, Any]) -> GroupClaim:
    """Claim the group as its newest attempt (O_EXCL: one creator per attempt number), renewed from a thread."""
    directory = claims_dir(out, generation, group)
    while True:
        attempt = max(_numbered(directory, _CLAIM), default=0) + 1
        record = {"group": group, "driver": generation, "attempt": attempt, **worker, "beats": 0}
        if _create_exclusive(directory / f"claim-{attempt}.lease", record):
            break
    claim = GroupClaim(out, generation, group, attempt, None)
    claim.check()  # the driver itself was replaced meanwhile: nothing to do
    claim._beating = _Beating(directory / f"claim-{attempt}.lease", record, timeout, claim.holds)
    return claim


def newest_claim(out: Path, generation: int, group: str) -> tuple[int, int] | None:
    """(attempt, beats) of the group's newest claim, or None before any worker claimed it."""
    directory = claims_dir(out, generation, group)
    attempts = _numbered(directory, _CLAIM)
    if not attempts:
        return None
    record = _read(directory / f"claim-{attempts[-1]}.lease") or {}
    return attempts[-1], int(record.get("beats", -1))


class ClaimWatch:
    """The driver's view of its groups' claims: a claim whose beats stay unchanged for `timeout`
    seconds (this host's monotonic clock) belongs to a worker paused or cut off."""

    def __init__(self, out: Path, generation: int, timeout: float) -> None:
        self.out, self.generation, self.timeout = Path(out), generation, timeout
        self.seen: dict[str, tuple[tuple[int, int], float]] = {}

    def lapsed(self, group: str) -> int | None:
        """The attempt whose claim lapsed, or None (renewed, or not claimed yet: a queued task)."""
        now, state = time.monotonic(), newest_claim(self.out, self.generation, group)
        if state is None:
            return None
        previous = self.seen.get(group)
        if previous is None or previous[0] != state:
            self.seen[group] = (state, now)
            return None
        return state[0] if now - previous[1] >= self.timeout else None

    def forget(self, group: str) -> None:
        self.seen.pop(group, None)
