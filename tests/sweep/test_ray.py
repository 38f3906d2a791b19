"""--executor ray on a local Ray cluster this module starts (2 CPUs) and stops: the same records
as a local run, a worker killed mid-unit (kill -9) retried with nothing lost or twice. The
cluster's workers cannot write under a run's --out (tests.sweep.helpers.forbid_writes_under_results):
every test here passes only if they hand every write to the driver."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from evalkit.errors import UserError
from evalkit.files import LOCK_NAME
from evalkit.ruler.runner import RulerBenchmark
from evalkit.sweep.pipeline import run_benchmark
from tests.helpers import any_running, command_line, descendants
from tests.sweep.helpers import (
    SHIPPED_FULL,
    HoldSecondChunkOnce,
    forbid_writes_under_results,
    outputs_of,
    run_cli,
    tiny_refs,
    tiny_settings,
)

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of this process (its raylet and workers are its descendants)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        # The hook lives in tests/: the workers import it by name, so they get the repository on
        # their path (pytest puts it on the driver's; an installed evalkit does not bring tests/).
        runtime_env={
            "worker_process_setup_hook": forbid_writes_under_results,
            "env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        },
    )
    yield
    ray.shutdown()


def executor():
    from evalkit.sweep.ray_executor import RayExecutor

    return RayExecutor()


def test_ray_run_equals_a_local_run_record_for_record(cluster, tmp_path):
    refs, settings = tiny_refs(), tiny_settings()
    local = run_benchmark(RulerBenchmark(settings), refs, tmp_path / "local")
    lines: list[str] = []
    remote = run_benchmark(RulerBenchmark(settings), refs, tmp_path / "ray", executor=executor(), log=lines.append)
    assert remote.rows == local.rows and remote.skipped == local.skipped and local.skipped
    assert outputs_of(tmp_path / "ray") == outputs_of(tmp_path / "local")
    assert any(line.startswith("ray: 6 units in 2 groups") for line in lines)  # one group per checkpoint
    assert not list(tmp_path.rglob(".evalkit-lease*"))  # neither run wrote a lease

    summary_path = next((tmp_path / "ray").rglob("ruler-summary.json"))
    summary = json.loads(summary_path.read_text())
    answered = summary["provenance"]["answered_by"]
    assert set(answered) == {"niah_single_1 @ 1024", "niah_single_2 @ 1024", "qa_1 @ 1024"}
    assert {w["attempt"] for w in answered.values()} == {1}  # the qa_1 skip (a user error) was not retried
    assert len({w["pid"] for w in answered.values()}) == 1  # a checkpoint's units on one worker, one engine

    # A rerun (a driver killed after the workers finished) computes nothing and keeps the stamp.
    run_benchmark(RulerBenchmark(settings), refs, tmp_path / "ray", executor=executor())
    assert outputs_of(tmp_path / "ray") == outputs_of(tmp_path / "local")
    rerun = json.loads(summary_path.read_text())
    assert rerun["provenance"]["created"] == summary["provenance"]["created"]

    board = tmp_path / "board.md"
    assert run_cli(["leaderboard", str(tmp_path / "ray"), "--out", str(board)]) == 0
    assert SHIPPED_FULL.name in board.read_text()


def test_general_under_ray_hands_its_files_to_the_driver_and_equals_a_local_run(cluster, tmp_path):
    """An lm-eval task on Ray: the unit's record, samples and lm-eval output, which the worker
    hands over and the driver writes, are the local run's (its record but for the time and place)."""
    from evalkit.general import GeneralBenchmark, GeneralSettings
    from evalkit.sweep.pipeline import run_benchmark

    refs, tasks, engine = tiny_refs()[-1:], ["evalkit_fixture_hellaswag_style"], {}  # served as trained (bf16)
    local = run_benchmark(GeneralBenchmark(GeneralSettings(tasks, engine_settings=engine)), refs, tmp_path / "local")
    remote = run_benchmark(
        GeneralBenchmark(GeneralSettings(tasks, engine_settings=engine)), refs, tmp_path / "ray", executor=executor()
    )
    assert remote.rows == local.rows and local.rows

    def unit_files(out: Path) -> dict[str, Path]:
        return {str(p.relative_to(out)): p for p in out.rglob("general/*") if p.is_file()}

    here, there = unit_files(tmp_path / "local"), unit_files(tmp_path / "ray")
    assert sorted(here) == sorted(there) and len(here) == 3  # record, samples, lm-eval output
    for rel, path in here.items():
        if rel.endswith(".samples.jsonl"):
            assert there[rel].read_bytes() == path.read_bytes()
        elif not rel.endswith(".lm_eval.json"):  # lm-eval's own output holds its timings
            record, local_record = json.loads(there[rel].read_text()), json.loads(path.read_text())
            assert {k: v for k, v in record.items() if k != "provenance"} == {
                k: v for k, v in local_record.items() if k != "provenance"
            }


def _group_workers():
    import psutil

    found = []
    for process in psutil.Process().children(recursive=True):  # only what this test's cluster started
        if "evaluate_group" in command_line(process):
            found.append(process)
    return found


@dataclass
class _MidUnit:
    """A Ray sweep of one 40-sample unit (two chunks, 32 then 8) running in a thread, returned
    once its first chunk is durable, its worker held before the second (HoldSecondChunkOnce): the
    caller acts on the group's one worker."""

    refs: list
    settings: object
    log_path: Path
    driver: threading.Thread
    lines: list[str]
    failure: list[BaseException]
    worker: object  # psutil.Process of the group's worker
    release: Path  # created: the held worker goes on to its second chunk


def _sweep_until_the_first_chunk(tmp_path: Path) -> _MidUnit:
    refs = tiny_refs()[-1:]  # one checkpoint, one unit: one group, one worker
    settings = tiny_settings(samples=40, tasks=["niah_single_1"])  # two chunks of 32 and 8
    log_path = tmp_path / "ray" / refs[0].run / f"step-{refs[0].step}" / "ruler" / "niah_single_1" / "1024.jsonl"
    lines: list[str] = []
    failure: list[BaseException] = []

    hold = HoldSecondChunkOnce(held=str(tmp_path / "held"), release=str(tmp_path / "release"))

    def drive():
        try:
            run_benchmark(RulerBenchmark(settings), refs, tmp_path / "ray", executor=executor(), log=lines.append,
                          open_engine=hold)  # fmt: skip
        except BaseException as err:  # noqa: BLE001 - raised again in the test's thread
            failure.append(err)

    driver = threading.Thread(target=drive)
    driver.start()
    deadline = time.monotonic() + 240
    try:
        while not (log_path.is_file() and log_path.read_text().count("\n") >= 32 and Path(hold.held).exists()):
            assert time.monotonic() < deadline and driver.is_alive(), (failure, lines)
            time.sleep(0.02)
        victims = _group_workers()
        assert len(victims) == 1
    except BaseException:
        # A held worker keeps a CPU of the module's 2-CPU cluster: let it finish, or the next test
        # that asks for both CPUs waits for ever.
        Path(hold.release).touch()
        driver.join(timeout=300)
        raise
    return _MidUnit(refs, settings, log_path, driver, lines, failure, victims[0], Path(hold.release))


def test_worker_killed_mid_unit_is_retried_with_no_sample_lost_or_twice(cluster, tmp_path):
    sweep = _sweep_until_the_first_chunk(tmp_path)
    refs, settings, log_path, driver = sweep.refs, sweep.settings, sweep.log_path, sweep.driver
    lines, failure, victims = sweep.lines, sweep.failure, [sweep.worker]
    killed_at = log_path.read_text().count("\n")
    os.kill(victims[0].pid, signal.SIGKILL)
    driver.join(timeout=300)
    assert not failure and not driver.is_alive(), failure
    assert killed_at == 32  # mid-unit: the first chunk durable, the second not yet
    assert any("retried (attempt 2" in line for line in lines), lines

    run_benchmark(RulerBenchmark(settings), refs, tmp_path / "local")
    killed, local = outputs_of(tmp_path / "ray"), outputs_of(tmp_path / "local")
    assert killed == local  # every sample once, in order, with the same predictions
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert sorted(r["index"] for r in records) == list(range(40))
    summary = json.loads(next((tmp_path / "ray").rglob("ruler-summary.json")).read_text())
    assert summary["provenance"]["answered_by"]["niah_single_1 @ 1024"]["attempt"] == 2


def test_the_workers_of_this_cluster_cannot_write_under_a_runs_out(cluster, tmp_path):
    """The guard every test of this module runs under: a worker's write under a directory holding
    evalkit's lock fails, its write elsewhere succeeds."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).touch()
    write = ray.remote(lambda path: Path(path).write_text("x"))
    with pytest.raises(ray.exceptions.RayTaskError, match="a Ray worker wrote under a run's --out"):
        ray.get(write.remote(str(out / "1024.jsonl")))
    assert not (out / "1024.jsonl").exists()
    ray.get(write.remote(str(tmp_path / "elsewhere.txt")))
    assert (tmp_path / "elsewhere.txt").read_text() == "x"


@pytest.mark.slow
def test_a_paused_worker_writes_nothing_and_its_group_ends_once_when_it_goes_on(cluster, tmp_path):
    """SIGSTOP of a worker mid-unit (alive to Ray, as a cut-off node is until declared dead):
    nothing more is written while it is paused (the driver writes only what workers hand over),
    and after SIGCONT the sweep completes with each sample stored once, record for record a local run's."""
    sweep = _sweep_until_the_first_chunk(tmp_path)
    refs, settings, log_path, driver = sweep.refs, sweep.settings, sweep.log_path, sweep.driver
    paused = sweep.worker
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        paused_at = log_path.read_text().count("\n")
        time.sleep(5)
        assert driver.is_alive() and log_path.read_text().count("\n") == paused_at
    finally:
        os.kill(paused.pid, signal.SIGCONT)
        sweep.release.touch()
    driver.join(timeout=300)
    assert not sweep.failure and not driver.is_alive(), (sweep.failure, sweep.lines)
    assert paused_at == 32  # paused mid-unit: its second chunk not yet written

    run_benchmark(RulerBenchmark(settings), refs, tmp_path / "local")
    assert outputs_of(tmp_path / "ray") == outputs_of(tmp_path / "local")  # record for record
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert sorted(r["index"] for r in records) == list(range(40))  # each sample stored once
    summary = json.loads(next((tmp_path / "ray").rglob("ruler-summary.json")).read_text())
    answered = summary["provenance"]["answered_by"]["niah_single_1 @ 1024"]
    assert answered["attempt"] == 1 and answered["pid"] == paused.pid


@pytest.mark.slow
def test_sigterm_to_the_driver_exits_143_and_stops_its_ray_instance(tmp_path):
    """`kill` (SIGTERM) to `evalkit ruler --executor ray` mid-sweep: exit 143 (Ray's own handler
    would abort, and Ray turns the handler's exit into status 1), no Ray process left behind;
    the rerun completes from the logs."""
    import subprocess
    import sys

    out = tmp_path / "out"
    run = str(SHIPPED_FULL)
    command = [sys.executable, "-m", "evalkit.cli", "ruler", "--ckpts", run, "--lengths", "1k",
               "--tasks", "niah_single_1", "--samples", "40", "--executor", "ray", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not any("evaluate_group" in command_line(p) for p in descendants(process.pid)):
        assert time.monotonic() < deadline and process.poll() is None, "no Ray worker started"
        time.sleep(0.5)
    family = {p.pid for p in descendants(process.pid)}
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while any_running(family):
        assert time.monotonic() < deadline, "a Ray process outlived the driver"
        time.sleep(1)
    assert subprocess.run(command, env=env, capture_output=True, timeout=300).returncode == 0
    records = [json.loads(line) for path in out.rglob("*.jsonl") for line in path.read_text().splitlines()]
    assert sorted(r["index"] for r in records) == sorted(list(range(40)) * 2)  # two checkpoints, each sample once


@pytest.mark.slow
def test_driver_killed_mid_sweep_then_rerun_equals_a_straight_run(tmp_path):
    """kill -9 of `evalkit ruler --executor ray` (and of every process it started) while its
    workers write: the rerun recomputes nothing stored, loses nothing, and its outputs equal an
    uninterrupted local run's, record for record."""
    import subprocess
    import sys

    out = tmp_path / "out"
    run = str(SHIPPED_FULL)
    command = [sys.executable, "-m", "evalkit.cli", "ruler", "--ckpts", run, "--lengths", "1k",
               "--tasks", "niah_single_1", "--samples", "40", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    process = subprocess.Popen([*command, "--executor", "ray"], env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 240
    while not any(path.read_text().count("\n") >= 8 for path in out.rglob("*.jsonl")):
        assert time.monotonic() < deadline and process.poll() is None, "no samples written"
        time.sleep(0.2)
    family = [process.pid, *(p.pid for p in descendants(process.pid))]
    for pid in family:  # every process this test started, by id (Ray's own may leave the group)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(timeout=60)
    deadline = time.monotonic() + 60
    while any_running(family):
        assert time.monotonic() < deadline, "a process outlived its kill"
        time.sleep(0.5)
    before = {path: path.read_bytes() for path in out.rglob("*.jsonl")}
    assert 8 <= sum(text.count(b"\n") for text in before.values()) < 80  # killed mid-sweep

    rerun = subprocess.run([*command, "--executor", "local"], env=env, capture_output=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr.decode()[-2000:]
    straight = tmp_path / "straight"
    refs = tiny_refs()
    run_benchmark(RulerBenchmark(tiny_settings(samples=40, tasks=["niah_single_1"])), refs, straight)
    assert outputs_of(out)[1] == outputs_of(straight)[1]  # every per-sample log, byte for byte
    assert outputs_of(out)[0].keys() == outputs_of(straight)[0].keys()
    for rel, summary in outputs_of(out)[0].items():
        assert summary["rows"] == outputs_of(straight)[0][rel]["rows"]
    for path, text in before.items():  # what was stored was kept (appended to, never redone)
        complete = text[: text.rfind(b"\n") + 1]
        assert path.read_bytes().startswith(complete)


def test_a_broken_checkpoint_under_ray_is_recorded_and_the_others_are_evaluated(cluster, tmp_path):
    """As a local sweep (tests/sweep/test_one_bad_checkpoint_does_not_end_a_sweep.py): the broken
    checkpoint's failure record, the good ones' summaries equal to a local run of them alone, one
    line naming the failure."""
    import shutil

    from evalkit.errors import UserError
    from evalkit.models.refs import resolve_checkpoints

    sweep = tmp_path / "sweep"
    shutil.copytree(SHIPPED_FULL, sweep)
    bad = sweep / "step-550" / "model.safetensors"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    settings = tiny_settings(samples=2, tasks=["niah_single_1"])
    refs = resolve_checkpoints([str(sweep)])
    with pytest.raises(UserError, match="1 of 2 checkpoints failed.*truncated or corrupt"):
        run_benchmark(RulerBenchmark(settings), refs, tmp_path / "ray", executor=executor())
    record = json.loads((tmp_path / "ray" / "sweep" / "step-550" / "ruler-failed.json").read_text())
    assert record["step"] == 550 and "truncated or corrupt" in record["reason"]
    assert not (tmp_path / "ray" / "sweep" / "step-550" / "ruler-summary.json").exists()

    run_benchmark(RulerBenchmark(settings), [r for r in refs if r.step == 600], tmp_path / "local")
    assert outputs_of(tmp_path / "ray") == outputs_of(tmp_path / "local")


def test_an_unreachable_ray_address_is_one_line_at_once(tmp_path):
    """No cluster at --ray-address: the command refuses within seconds, in one line (ray.init
    alone retries for minutes). A fresh process: this module's own Ray connection stays out of it."""
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "out"
    command = [sys.executable, "-m", "evalkit.cli", "ruler", "--ckpts", str(SHIPPED_FULL),
               "--lengths", "1k", "--tasks", "niah_single_1", "--samples", "2", "--executor", "ray",
               "--ray-address", f"127.0.0.1:{port}", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in lines[-1] and "within 5 s" in lines[-1]
    assert "Traceback" not in done.stderr
    assert not any(out.rglob("*.json"))


# --- how many model copies a node runs (issue #36) ---


class _FakeRay:
    """What task_resources and concurrent_copies read of a cluster: its nodes' resources."""

    def __init__(self, *nodes: dict):
        self._nodes = [{"Alive": True, "Resources": node} for node in nodes]

    def nodes(self):
        return self._nodes

    def cluster_resources(self):
        return {key: sum(n["Resources"].get(key, 0) for n in self._nodes) for key in ("CPU", "GPU", "memory")}


def test_cpu_nodes_run_as_many_model_copies_as_fit_in_memory(tmp_path):
    """A checkpoint of 1 GiB of weights asks 3 GiB per task: a 16-core node with 10 GiB for Ray runs
    3 copies (10 // 3), not 16; a second node of 4 cores and 32 GiB runs 4 (its cores): 7 in all."""
    from evalkit.ruler.runner import RulerBenchmark
    from evalkit.sweep.ray_executor import concurrent_copies, task_resources

    (tmp_path / "model.safetensors").write_bytes(b"")
    with open(tmp_path / "model.safetensors", "r+b") as handle:
        handle.truncate(2**30)  # sparse: 1 GiB on paper, nothing on disk
    cluster = _FakeRay({"CPU": 16.0, "memory": 10.0 * 2**30}, {"CPU": 4.0, "memory": 32.0 * 2**30})
    asked = task_resources(cluster, RulerBenchmark(tiny_settings()), [tmp_path])
    assert asked == {"num_cpus": 1.0, "memory": 3 * 2**30}
    assert concurrent_copies([n["Resources"] for n in cluster.nodes()], asked) == 3 + 4
    # --ray-resources cpus=4: 4 CPUs and still the memory; on the first node 16 // 4 = 4 but 10 // 3 = 3
    more = task_resources(cluster, RulerBenchmark(tiny_settings()), [tmp_path], {"num_cpus": 4.0})
    assert more == {"num_cpus": 4.0, "memory": 3 * 2**30}
    assert concurrent_copies([n["Resources"] for n in cluster.nodes()], more) == 3 + 1
    assert (
        concurrent_copies([{"CPU": 16.0, "memory": 10.0 * 2**30}], {"memory": 2**30}) == 10
    )  # 1 CPU each: 16, memory: 10
    small = _FakeRay({"CPU": 8.0, "memory": 2.0 * 2**30})
    with pytest.raises(UserError, match=r"needs about 3.0 GiB .*the largest: 2.0 GiB\); give --ray-resources memory="):
        task_resources(small, RulerBenchmark(tiny_settings()), [tmp_path])
    given = {"memory": 2**30}  # the user's own estimate: taken as given, no refusal
    assert task_resources(small, RulerBenchmark(tiny_settings()), [tmp_path], given) == {"num_cpus": 1.0, **given}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("cpus=4", {"num_cpus": 4.0}),
        ("cpus=2, memory=8G", {"num_cpus": 2.0, "memory": 8 * 2**30}),
        ("gpus=0.5,memory=512MiB", {"num_gpus": 0.5, "memory": 512 * 2**20}),
        ("memory=1048576", {"memory": 2**20}),
    ],
)
def test_ray_resources_parse(text, expected):
    from evalkit.sweep.ray_executor import parse_ray_resources

    assert parse_ray_resources(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [("cpu=4", "'cpu=4' is not one of cpus=N"), ("cpus=0", "'0' is not a positive number"),
     ("memory=lots", "'lots' is not a non-negative amount"), (" , ", "is empty")],
)  # fmt: skip
def test_bad_ray_resources_are_one_line(text, message):
    from evalkit.sweep.ray_executor import parse_ray_resources

    with pytest.raises(UserError, match=message):
        parse_ray_resources(text)


def test_ray_resources_without_ray_is_refused(tmp_path, capsys):
    args = ["ruler", "--ckpts", str(tiny_refs()[0].path), "--lengths", "1k", "--ray-resources", "cpus=2"]
    assert run_cli([*args, "--out", str(tmp_path / "out")]) == 2
    assert "--ray-resources needs --executor ray" in capsys.readouterr().err


def test_the_log_says_how_many_model_copies_run_at_once(cluster, tmp_path):
    """The module's 2-CPU cluster asked for 2 CPUs a task runs one model copy at a time, and the log
    says so; the records equal a local run's. By default (1 CPU and 3x the tiny weights' 2.6 MB), 2."""
    from evalkit.sweep.ray_executor import RayExecutor

    refs, settings = tiny_refs(), tiny_settings(samples=1, tasks=["niah_single_1"])
    lines: list[str] = []
    run_benchmark(
        RulerBenchmark(settings),
        refs,
        tmp_path / "ray",
        executor=RayExecutor(resources={"num_cpus": 2.0}),
        log=lines.append,
    )
    assert any(
        line.startswith("ray: each task asks 2 CPUs, 7.5 MiB memory: 1 concurrent model copies") for line in lines
    )
    run_benchmark(RulerBenchmark(settings), refs, tmp_path / "local")
    assert outputs_of(tmp_path / "ray") == outputs_of(tmp_path / "local")
    default: list[str] = []
    run_benchmark(RulerBenchmark(settings), refs, tmp_path / "ray2", executor=RayExecutor(), log=default.append)
    asked = next(line for line in default if line.startswith("ray: each task asks"))
    assert asked.startswith("ray: each task asks 1 CPUs, 7.5 MiB memory: 2 concurrent model copies"), asked
