"""--executor ray --ray-address on two Ray nodes on this machine (`ray start --head` and a second
`ray start --address`; Ray turns a loopback address into this machine's own, so they meet
there), started by this test and stopped by it (only its own processes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.sweep.helpers import SHIPPED_FULL, outputs_of

pytest.importorskip("ray")
RAY = Path(sys.executable).with_name("ray")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_node(args: list[str], env: dict) -> subprocess.Popen:
    """`ray start ... --block` in a session of its own: stopping it stops every process it started."""
    return subprocess.Popen(
        [str(RAY), "start", "--block", "--num-cpus=1", "--disable-usage-stats", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stop(node: subprocess.Popen) -> None:
    try:
        os.killpg(node.pid, signal.SIGTERM)
        node.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(node.pid, signal.SIGKILL)


@pytest.mark.slow
def test_two_nodes_on_loopback_equal_a_local_run(tmp_path):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    port = _free_port()
    address = f"127.0.0.1:{port}"
    temp_dir = tempfile.mkdtemp(prefix="ekray", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    head = _start_node(
        [
            "--head",
            f"--port={port}",
            "--include-dashboard=false",
            f"--temp-dir={temp_dir}",
        ],
        env,
    )
    nodes = [head]
    try:
        time.sleep(8)
        nodes.append(_start_node([f"--address={address}"], env))
        time.sleep(8)
        assert [node.poll() for node in nodes] == [None, None], "a ray node did not start"
        run = SHIPPED_FULL
        common = ["ruler", "--ckpts", str(run), "--lengths", "1k", "--tasks", "niah_single_1,qa_1", "--samples", "3"]
        for name, extra in (("local", []), ("ray", ["--executor", "ray", "--ray-address", address])):
            done = subprocess.run(
                [sys.executable, "-m", "evalkit.cli", *common, *extra, "--out", str(tmp_path / name)],
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert done.returncode == 0, done.stderr[-3000:]
        assert "on 2 node(s), 2 CPUs" in done.stderr
        assert outputs_of(tmp_path / "ray") == outputs_of(tmp_path / "local")
        answered = [
            json.loads(path.read_text())["provenance"]["answered_by"]["niah_single_1 @ 1024"]["node"]
            for path in sorted((tmp_path / "ray").rglob("ruler-summary.json"))
        ]
        assert len(set(answered)) == 2  # one checkpoint per node
    finally:
        for node in reversed(nodes):
            _stop(node)
        shutil.rmtree(temp_dir, ignore_errors=True)
