"""One writer per --out: on one host the flock (tests/cli/test_one_writer.py); across the hosts of a
shared file system, where flock may not reach, the lock file's record of the run holding it
(evalkit.files.output_lock); under Ray, the driver writes what its workers hand over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalkit.errors import UserError
from evalkit.files import LOCK_NAME, OTHER_HOST_QUIET_S, output_lock
from tests.sweep.helpers import SHIPPED_FULL, outputs_of, tiny_refs, tiny_settings

ROOT = Path(__file__).parents[2]
NODE_B = {"host": "node-b", "pid": 4242, "started": "2026-12-01 10:00:00 UTC"}


def _held_by(out: Path, record: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_NAME).write_text(json.dumps(record) + "\n")


def _age(out: Path, seconds: float) -> None:
    """Everything under `out` last written `seconds` ago."""
    then = time.time() - seconds
    for path in [out, *out.rglob("*")]:
        os.utime(path, (then, then))


def test_a_run_of_another_host_that_wrote_recently_refuses_this_one_in_one_line(tmp_path):
    """flock succeeded (it may not reach across hosts), yet the record names another host and the
    directory was written a moment ago: refused, the record left as it was."""
    out = tmp_path / "out"
    _held_by(out, NODE_B)
    log = out / "run" / "step-1" / "ruler" / "niah_single_1" / "1024.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("")
    _age(out, OTHER_HOST_QUIET_S + 60)
    log.touch()  # that run's last append: now
    with pytest.raises(UserError) as refused, output_lock(out):
        pass
    message = str(refused.value)
    assert "\n" not in message and "the evalkit run of host node-b pid 4242 (since 2026-12-01 10:00:00 UTC)" in message
    assert f"is writing to {out}" in message and "another --out" in message
    assert json.loads((out / LOCK_NAME).read_text()) == NODE_B  # nothing taken


def test_a_record_of_another_host_quiet_for_the_window_is_a_dead_run_and_taken_over(tmp_path):
    out = tmp_path / "out"
    _held_by(out, NODE_B)
    _age(out, OTHER_HOST_QUIET_S + 60)  # a run killed there, nothing written since
    with output_lock(out) as lock:
        record = json.loads(lock.read_text())
        assert (record["host"], record["pid"]) == (socket.gethostname(), os.getpid())
    assert (out / LOCK_NAME).read_text() == ""  # a clean end: no one holds it


def test_a_record_of_this_host_is_judged_by_the_flock_alone(tmp_path):
    """A run of this host killed (its record left): the flock was free, so it is dead; taken at once."""
    out = tmp_path / "out"
    _held_by(out, {"host": socket.gethostname(), "pid": 4242, "started": "2026-12-01 10:00:00 UTC"})
    with output_lock(out) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert (out / LOCK_NAME).read_text() == ""


def test_a_worker_write_outside_out_is_refused_by_the_driver(tmp_path):
    from evalkit.sweep.ray_executor import write_handed_over

    write_handed_over(tmp_path, "append", "a/b.jsonl", "1\n")
    write_handed_over(tmp_path, "append", "a/b.jsonl", "2\n")
    write_handed_over(tmp_path, "text", "a/c.json", "{}\n")
    assert (tmp_path / "a" / "b.jsonl").read_text() == "1\n2\n" and (tmp_path / "a" / "c.json").read_text() == "{}\n"
    for kind, rel in (("append", "../escape.jsonl"), ("text", "/tmp/escape.json"), ("unlink", "a/c.json")):
        with pytest.raises(RuntimeError, match="a worker handed over a write evalkit does not make"):
            write_handed_over(tmp_path, kind, rel, "x")
    assert not (tmp_path.parent / "escape.jsonl").exists() and (tmp_path / "a" / "c.json").exists()


_DRIVER_ON_HOST = """
import os, socket, sys
import evalkit.files
evalkit.files._take = lambda handle, directory: None  # a shared file system where flock does not reach across hosts
socket.gethostname = lambda: os.environ["FAKE_HOST"]
from evalkit.cli import main
sys.argv = ["evalkit", *sys.argv[1:]]
main()
"""


def test_two_drivers_of_two_hosts_on_one_out_the_second_is_refused_and_runs_once_the_first_ended(tmp_path):
    out = tmp_path / "out"
    run = str(SHIPPED_FULL / "step-600")
    command = [sys.executable, "-c", _DRIVER_ON_HOST, "ruler", "--ckpts", run, "--lengths", "1k",
               "--tasks", "niah_single_1", "--samples", "8", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    a = subprocess.Popen(command, env={**env, "FAKE_HOST": "node-a"}, **pipes)
    deadline = time.monotonic() + 120
    while "node-a" not in ((out / LOCK_NAME).read_text() if (out / LOCK_NAME).is_file() else ""):
        assert time.monotonic() < deadline and a.poll() is None, a.communicate()
        time.sleep(0.05)
    os.kill(a.pid, signal.SIGSTOP)  # A holds --out however fast its sweep: B starts while A runs
    try:
        b = subprocess.run(command, env={**env, "FAKE_HOST": "node-b"}, timeout=300, **pipes)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    _, a_err = a.communicate(timeout=300)
    assert a.returncode == 0, a_err
    assert b.returncode == 2, b.stderr
    lines = [line for line in b.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in b.stderr, b.stderr
    assert lines[0].startswith("error: the evalkit run of host node-a pid ") and f"is writing to {out}" in lines[0]

    from evalkit.ruler.runner import RulerBenchmark
    from evalkit.sweep.pipeline import run_benchmark

    single = tmp_path / "single"
    run_benchmark(
        RulerBenchmark(tiny_settings(samples=8, tasks=["niah_single_1"])),
        [r for r in tiny_refs() if r.step == 600],
        single,
    )
    raced, alone = outputs_of(out), outputs_of(single)
    assert raced[1] == alone[1] and raced[1]  # the per-sample logs, byte for byte: one writer
    assert {k: v["rows"] for k, v in raced[0].items()} == {k: v["rows"] for k, v in alone[0].items()}

    again = subprocess.run(command, env={**env, "FAKE_HOST": "node-b"}, timeout=300, **pipes)
    assert again.returncode == 0, again.stderr  # node-a's run ended cleanly: its record is gone
    assert outputs_of(out)[1] == alone[1]
