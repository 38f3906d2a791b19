"""The one-writer lease across hosts (evalkit/sweep/lease.py), with flock out of the picture:
one driver per --out (a second refused in one line, a dead one's lease taken over by exactly
one newcomer), and a group's claim fencing a superseded worker off its sample log."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evalkit.errors import UserError
from evalkit.files import atomic_write_json, fenced
from evalkit.store.sample_log import SampleLog
from evalkit.sweep import lease as leases
from tests.sweep.helpers import SHIPPED, outputs_of, tiny_refs, tiny_settings

ROOT = Path(__file__).parents[2]


def _driver_files(out: Path) -> list[str]:
    return sorted(p.name for p in (out / leases.LEASE_DIR).glob("driver-*.lease"))


def _hold_and_vanish(out: str, ready) -> None:
    """A driver that takes the lease and dies without releasing it (as kill -9 would leave it)."""
    leases.acquire_driver_lease(Path(out), timeout=30, log=lambda _line: None)
    ready.set()
    os._exit(0)


def test_a_dead_drivers_lease_on_this_host_is_taken_over_at_once(tmp_path):
    ready = multiprocessing.get_context("fork").Event()
    holder = multiprocessing.get_context("fork").Process(target=_hold_and_vanish, args=(str(tmp_path), ready))
    holder.start()
    holder.join(timeout=60)
    assert ready.is_set() and _driver_files(tmp_path) == ["driver-1.lease"]
    stale = json.loads((tmp_path / leases.LEASE_DIR / "driver-1.lease").read_text())
    assert stale["pid"] == holder.pid and not stale["released"]

    began = time.monotonic()
    taken = leases.acquire_driver_lease(tmp_path, timeout=30, log=lambda _line: None)
    assert time.monotonic() - began < 5  # same host: a pid that no longer runs is dead, no waiting
    assert taken.generation == 2 and _driver_files(tmp_path) == ["driver-2.lease"]
    taken.release()
    assert leases.acquire_driver_lease(tmp_path, timeout=30).generation == 3  # released: free at once


def _fake_holder(out: Path, host: str, beats: bool, timeout: float):
    """Generation 1 as a driver of another host wrote it; renewed from a thread when `beats`."""
    record = {
        "host": host,
        "boot_id": "x",
        "pid_ns": "x",
        "pid": 4242,
        "started": None,
        "since": "2026-12-01 10:00:00 UTC",
    }
    record.update(beats=0, released=False)
    path = out / leases.LEASE_DIR / "driver-1.lease"
    assert leases._create_exclusive(path, record)
    return leases._Beating(path, record, timeout, lambda: True) if beats else None


def test_a_live_driver_on_another_host_refuses_a_second_in_one_line(tmp_path):
    renewing = _fake_holder(tmp_path, "node-b", beats=True, timeout=1.0)
    lines: list[str] = []
    try:
        with pytest.raises(UserError) as refused:
            leases.acquire_driver_lease(tmp_path, timeout=1.0, log=lines.append)
    finally:
        renewing.stop()
    message = str(refused.value)
    assert "\n" not in message and "host node-b pid 4242 since 2026-12-01 10:00:00 UTC" in message
    assert "another --out" in message
    assert any("watching for up to 1 s" in line for line in lines)  # another host: no pid to ask
    assert _driver_files(tmp_path) == ["driver-1.lease"]  # nothing taken


def test_a_silent_driver_on_another_host_is_taken_over_after_the_timeout(tmp_path):
    _fake_holder(tmp_path, "node-b", beats=False, timeout=1.0)
    began = time.monotonic()
    taken = leases.acquire_driver_lease(tmp_path, timeout=1.0, log=lambda _line: None)
    assert time.monotonic() - began >= 1.0  # observed unchanged for the whole timeout, on this clock
    assert taken.generation == 2
    taken.release()


@pytest.mark.parametrize("damage", ["garbage{", '{"pid": "abc", "started": "x"}', "[1, 2]"])
def test_a_damaged_lease_file_is_watched_then_taken_over_never_a_crash(tmp_path, damage):
    """A lease file edited or damaged (not JSON, or a record of the wrong types, on this host's
    own identity too) reads as unreadable: watched for the timeout, then taken over."""
    directory = tmp_path / leases.LEASE_DIR
    directory.mkdir()
    record = damage
    if damage.startswith('{"pid"'):  # this host's identity, so the pid would be judged at once
        record = json.dumps({**leases.host_identity(), **json.loads(damage)})
    (directory / "driver-1.lease").write_text(record)
    lines: list[str] = []
    taken = leases.acquire_driver_lease(tmp_path, timeout=0.5, log=lines.append)
    assert taken.generation == 2 and any("watching" in line for line in lines), lines
    taken.release()


def test_a_lease_being_created_is_never_seen_half_written(tmp_path, monkeypatch):
    """A newcomer racing the holder's birth read its empty lease as a silent holder and printed
    "watching" (CI, stop 33). The record is written under a private name and linked in whole: while
    the holder's write is slowed, its lease's name does not exist; once it does, it reads whole."""
    path = tmp_path / leases.LEASE_DIR / "driver-1.lease"
    writing, finish = threading.Event(), threading.Event()
    real_write = leases._write_record

    def slowed(target: Path, record: dict) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text('{"host": ')  # the creator is mid-write ...
        writing.set()
        finish.wait(timeout=30)  # ... for as long as the test looks
        real_write(target, record)

    monkeypatch.setattr(leases, "_write_record", slowed)
    creator = threading.Thread(target=leases._create_exclusive, args=(path, {"pid": 7, "beats": 0}))
    creator.start()
    assert writing.wait(timeout=30)
    assert not path.exists() and leases._numbered(path.parent, leases._DRIVER) == []
    finish.set()
    creator.join(timeout=30)
    assert leases._read(path) == {"pid": 7, "beats": 0}
    assert [p.name for p in path.parent.iterdir()] == ["driver-1.lease"]  # the private name is gone


def test_without_hard_links_the_lease_is_created_with_o_excl(tmp_path, monkeypatch):
    def no_links(_source, _target):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(leases.os, "link", no_links)
    path = tmp_path / leases.LEASE_DIR / "driver-1.lease"
    assert leases._create_exclusive(path, {"pid": 1})
    assert not leases._create_exclusive(path, {"pid": 2})  # one creator of a name, still
    assert leases._read(path) == {"pid": 1} and [p.name for p in path.parent.iterdir()] == ["driver-1.lease"]


def test_a_link_whose_reply_was_lost_counts_as_made_and_a_taken_name_as_taken(tmp_path, monkeypatch):
    """NFS can answer a retried link "exists" though its first try made it: the private file's
    link count tells the two apart."""
    real_link = os.link

    def link_then_lose_the_reply(source, target):
        real_link(source, target)
        raise FileExistsError(errno.EEXIST, "File exists")

    path = tmp_path / leases.LEASE_DIR / "driver-1.lease"
    monkeypatch.setattr(leases.os, "link", link_then_lose_the_reply)
    assert leases._create_exclusive(path, {"pid": 1})
    monkeypatch.setattr(leases.os, "link", real_link)
    assert not leases._create_exclusive(path, {"pid": 2}) and leases._read(path) == {"pid": 1}


def test_an_empty_lease_filled_in_a_moment_is_judged_by_its_record_not_watched(tmp_path):
    """Where a lease is created with O_EXCL (no hard links) its name is empty for a moment: the
    newcomer waits that moment out and judges the record (here a live holder on this host: refused
    at once), instead of watching a "silent" holder for the whole timeout."""
    directory = tmp_path / leases.LEASE_DIR
    directory.mkdir()
    path = directory / "driver-1.lease"
    path.write_text("")
    record = {**leases.host_identity(), "pid": os.getpid(), "started": leases._process_start(os.getpid())}
    record.update(since="2026-12-01 10:00:00 UTC", beats=0, released=False)
    threading.Timer(0.2, lambda: path.write_text(json.dumps(record))).start()
    lines: list[str] = []
    began = time.monotonic()
    with pytest.raises(UserError, match=f"pid {os.getpid()} since 2026-12-01"):
        leases.acquire_driver_lease(tmp_path, timeout=20, log=lines.append)
    assert lines == [] and time.monotonic() - began < 5


def _race(out: str, start, results) -> None:
    start.wait()
    try:
        lease = leases.acquire_driver_lease(Path(out), timeout=30, log=lambda _line: None)
        results.put(("won", lease.generation))
        time.sleep(3)  # alive while the others judge it
        lease.release()
    except UserError as err:
        results.put(("refused", str(err)))


def test_of_newcomers_racing_for_a_dead_drivers_lease_exactly_one_wins(tmp_path):
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    dead = context.Process(target=_hold_and_vanish, args=(str(tmp_path), ready))
    dead.start()
    dead.join(timeout=60)
    start, results = context.Event(), context.Queue()
    racers = [context.Process(target=_race, args=(str(tmp_path), start, results)) for _ in range(4)]
    for racer in racers:
        racer.start()
    start.set()
    outcomes = [results.get(timeout=60) for _ in racers]
    for racer in racers:
        racer.join(timeout=60)
    assert sorted(kind for kind, _ in outcomes) == ["refused", "refused", "refused", "won"], outcomes
    assert [value for kind, value in outcomes if kind == "won"] == [2]


def test_a_superseded_claim_writes_no_more_lines(tmp_path):
    """Attempt 1 appends; attempt 2 claims the group; attempt 1's next append raises and the log
    is unchanged; a new driver generation fences attempt 2 the same way."""
    driver = leases.acquire_driver_lease(tmp_path, timeout=30)
    log_path = tmp_path / "run" / "step-1" / "ruler" / "t" / "1024.jsonl"
    first = leases.claim_group(tmp_path, driver.generation, "g", 30, {"pid": 1})
    with fenced(first.check):
        SampleLog(log_path, "k").append([{"index": 0, "prediction": "a"}])
    second = leases.claim_group(tmp_path, driver.generation, "g", 30, {"pid": 2})
    assert (first.attempt, second.attempt) == (1, 2)
    before = log_path.read_bytes()
    with fenced(first.check), pytest.raises(leases.LeaseLost, match="attempt 1 was superseded"):
        SampleLog(log_path, "k").append([{"index": 1, "prediction": "b"}])
    assert log_path.read_bytes() == before
    with fenced(second.check):
        SampleLog(log_path, "k").append([{"index": 1, "prediction": "b"}])

    # A newer driver (this one lost its lease): its workers and its summaries are fenced too.
    assert leases._create_exclusive(tmp_path / leases.LEASE_DIR / "driver-2.lease", {"host": "node-b", "pid": 7})
    before = log_path.read_bytes()
    with fenced(second.check), pytest.raises(leases.LeaseLost):
        SampleLog(log_path, "k").append([{"index": 2, "prediction": "c"}])
    summary = tmp_path / "run" / "step-1" / "ruler-summary.json"
    with fenced(driver.check), pytest.raises(leases.LeaseLost, match="host node-b pid 7 took over"):
        atomic_write_json(summary, {"rows": []})
    assert log_path.read_bytes() == before and not summary.exists()
    first.stop(), second.stop(), driver.release()


def test_the_reader_keeps_one_record_per_sample_when_a_late_batch_lands(tmp_path):
    """The window the fence leaves (a worker paused between its check and its write): its batch
    lands after the replacement's; the reader keeps the first record of each index, so each
    sample counts once and none is lost."""
    path = tmp_path / "1024.jsonl"
    replacement = SampleLog(path, "k")
    replacement.append([{"index": i, "prediction": f"new{i}"} for i in range(3)])
    late = SampleLog(tmp_path / "other.jsonl", "k")  # the paused worker's records, same samples
    late.append([{"index": i, "prediction": f"old{i}"} for i in (2, 3)])
    with path.open("a") as handle:
        handle.write((tmp_path / "other.jsonl").read_text())
    reread = SampleLog(path, "k")
    assert [(r["index"], r["prediction"]) for r in reread.ordered()] == [
        (0, "new0"),
        (1, "new1"),
        (2, "new2"),
        (3, "old3"),
    ]
    assert path.read_text().count("\n") == 4  # rewritten without the duplicate


_DRIVER_WITHOUT_FLOCK = """
import sys, time
from pathlib import Path
import evalkit.files
evalkit.files._take = lambda handle, directory: None  # a file system where flock does not hold
from evalkit.cli import main
ready, everyone = Path(sys.argv[1]), [Path(p) for p in sys.argv[2].split(",")]
ready.touch()
while not all(p.exists() for p in everyone):  # both drivers start at once, imports done
    time.sleep(0.01)
sys.argv = ["evalkit", *sys.argv[3:]]
main()
"""


def test_two_drivers_at_once_without_flock_one_proceeds_the_other_is_refused(tmp_path):
    out = tmp_path / "out"
    run = str(SHIPPED / "tiny-long-full-shipped" / "step-600")
    command = ["ruler", "--ckpts", run, "--lengths", "1k", "--tasks", "niah_single_1", "--samples", "8",
               "--out", str(out)]  # fmt: skip
    ready = [tmp_path / f"ready-{i}" for i in range(2)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    drivers = [
        subprocess.Popen(
            [sys.executable, "-c", _DRIVER_WITHOUT_FLOCK, str(ready[i]), ",".join(map(str, ready)), *command],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    done = [(d.wait(timeout=300), *d.communicate()) for d in drivers]
    codes = sorted(code for code, _, _ in done)
    assert codes == [0, 2], done
    refused = next(stderr for code, _, stderr in done if code == 2)
    lines = [line for line in refused.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in refused, refused
    assert lines[0].startswith("error: the evalkit run of host ") and f"is writing to {out}" in lines[0]

    from evalkit.ruler.runner import run_ruler

    single = tmp_path / "single"
    refs = [r for r in tiny_refs() if r.step == 600]
    run_ruler(refs, tiny_settings(samples=8, tasks=["niah_single_1"]), single)
    raced, alone = outputs_of(out), outputs_of(single)
    assert raced[1] == alone[1] and raced[1]  # the per-sample logs, byte for byte
    assert {k: v["rows"] for k, v in raced[0].items()} == {k: v["rows"] for k, v in alone[0].items()}


_DRIVER_ON_HOST = """
import os, sys
import evalkit.sweep.lease as lease
import evalkit.files
evalkit.files._take = lambda handle, directory: None  # a file system where flock does not hold
lease.host_identity = lambda: {"host": os.environ["FAKE_HOST"], "boot_id": "b", "pid_ns": "n"}
from evalkit.cli import main
sys.argv = ["evalkit", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
def test_a_driver_paused_past_its_lease_is_taken_over_and_then_writes_nothing_more(tmp_path):
    """Two drivers "on two hosts" over one --out: A paused (SIGSTOP) mid-unit longer than the lease
    timeout, B takes the lease over and completes the sweep; A resumed (SIGCONT) stops with one
    line and writes not one more line; the logs equal a single run's."""
    import signal

    out = tmp_path / "out"
    run = str(SHIPPED / "tiny-long-full-shipped" / "step-600")
    command = [sys.executable, "-c", _DRIVER_ON_HOST, "ruler", "--ckpts", run, "--lengths", "1k",
               "--tasks", "niah_single_1", "--samples", "40", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", leases.TIMEOUT_ENV: "2"}
    log_path = out / "tiny-long-full-shipped" / "step-600" / "ruler" / "niah_single_1" / "1024.jsonl"
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    a = subprocess.Popen(command, env={**env, "FAKE_HOST": "node-a"}, **pipes)
    try:
        deadline = time.monotonic() + 240
        while not (log_path.is_file() and log_path.read_text().count("\n") >= 32):  # the first chunk of 32
            assert time.monotonic() < deadline and a.poll() is None, a.communicate()
            time.sleep(0.02)
        os.kill(a.pid, signal.SIGSTOP)
        assert log_path.read_text().count("\n") == 32  # paused mid-unit
        b = subprocess.run(command, env={**env, "FAKE_HOST": "node-b"}, timeout=300, **pipes)
        assert b.returncode == 0, b.stderr
        assert "host node-a pid" in b.stdout + b.stderr  # it watched A's lease before taking it over
        completed = log_path.read_bytes()
    finally:
        os.kill(a.pid, signal.SIGCONT)
    _, a_err = a.communicate(timeout=120)
    assert a.returncode == 2, a_err
    errors = [line for line in a_err.splitlines() if line.startswith("error:")]  # after its progress bar
    assert len(errors) == 1 and "host node-b pid" in errors[0] and "took over" in errors[0], a_err
    assert a_err.rstrip().endswith(errors[0]) and "Traceback" not in a_err
    assert log_path.read_bytes() == completed  # A wrote nothing more

    from evalkit.ruler.runner import run_ruler

    single = tmp_path / "single"
    run_ruler([r for r in tiny_refs() if r.step == 600], tiny_settings(samples=40, tasks=["niah_single_1"]), single)
    raced, alone = outputs_of(out), outputs_of(single)
    assert raced[1] == alone[1]  # the per-sample logs, byte for byte
    assert {k: v["rows"] for k, v in raced[0].items()} == {k: v["rows"] for k, v in alone[0].items()}
