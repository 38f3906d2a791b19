"""tensor_parallel_size and data_parallel_size reach vLLM and change nothing in the answers.

Data parallelism runs two replicas as Ray actors; tensor parallelism splits every layer's
heads over two workers, each with its own packed-request tracker. On a CPU, vLLM needs its
OpenMP threads bound by hand for two workers (VLLM_CPU_OMP_THREADS_BIND), one core each.
Several engine starts: marked slow. Needs vLLM.
"""

import os

import pytest
import torch

from evalkit.engines import PackedRequest
from tests.helpers import any_running

from . import agreement
from .conftest import ENGINE_DTYPE, LOGPROB_ATOL, requires_vllm, start_vllm_engine, stop_vllm_engine

pytestmark = [requires_vllm, pytest.mark.slow]

PROMPTS = ["The grass is green.", "Hello there", "One two three", "The sky is blue. " * 20, "x"]
PACKED = [PackedRequest(["The grass is green. " * 8, "The sky is blue."], " Q?"), PackedRequest(["A", "B"], " C")]


@pytest.fixture
def two_cpu_workers(monkeypatch):
    if not torch.cuda.is_available():
        if (os.cpu_count() or 1) < 2:
            pytest.skip("two CPU workers need two cores")
        monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")


@pytest.mark.parametrize("setting", ["data_parallel_size", "tensor_parallel_size"])
def test_parallel_engines_answer_like_the_hf_engine(checkpoint, hf_engine, tokenizer, two_cpu_workers, setting):
    engine = start_vllm_engine(checkpoint, batch_size=4, packed=True, **{setting: 2})
    try:
        assert engine.engine_info()[setting] == 2
        if ENGINE_DTYPE == "bf16":  # teacher-forced (agreement.py: free-running bf16 texts part)
            assert agreement.plain_agreement(engine, hf_engine.model, [engine.encode(p) for p in PROMPTS], 10) == []
            assert agreement.packed_agreement(engine, hf_engine, tokenizer, PACKED, 10) == []
            return
        assert engine.generate(PROMPTS, 10) == hf_engine.generate(PROMPTS, 10)
        torch.testing.assert_close(
            engine.logits_packed(PACKED), hf_engine.logits_packed(PACKED).log_softmax(-1), atol=LOGPROB_ATOL, rtol=0
        )
    finally:
        stop_vllm_engine(engine)


def test_two_data_parallel_replicas_answer_as_one_replica(checkpoint, two_cpu_workers):
    """The replicas (Ray actors) against one vLLM engine of the same settings, directly: the same
    greedy texts and packed log-probabilities, in the requests' order."""
    many = PROMPTS * 3  # more requests than replicas, so the split and the reassembly both count
    answers = {}
    for replicas in (1, 2):
        engine = start_vllm_engine(checkpoint, batch_size=4, packed=True, data_parallel_size=replicas)
        try:
            answers[replicas] = (engine.generate(many, 10), engine.logits_packed(PACKED))
        finally:
            stop_vllm_engine(engine)
    assert answers[2][0] == answers[1][0]
    torch.testing.assert_close(answers[2][1], answers[1][1], atol=LOGPROB_ATOL, rtol=0)


SERVE_UNTIL_TERMINATED = """
import signal, sys
from evalkit.cli import _exit_on_sigterm
from evalkit.engines import get_engine
signal.signal(signal.SIGTERM, _exit_on_sigterm)  # as the evalkit command does
engine = get_engine("vllm", sys.argv[1], dtype="fp32", batch_size=4, data_parallel_size=2)
try:
    print("ready", flush=True)
    while True:
        engine.generate(["The grass is green."] * 4, 8)
finally:
    engine.close()
"""


def test_sigterm_stops_both_replicas_and_their_vllm_processes(checkpoint, two_cpu_workers, tmp_path):
    """SIGTERM to a process serving data_parallel_size 2: it exits 143 and leaves no replica
    (Ray actor) and no vLLM engine-core process running."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from .test_cli import engine_core_pids

    before = engine_core_pids()
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE_UNTIL_TERMINATED, str(checkpoint)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )  # fmt: skip
    assert process.stdout.readline().strip() == "ready", "the engine did not start"
    # Polled: a process's VLLM:: title is its own to set, and was once not yet seen at "ready".
    deadline = time.monotonic() + 60
    while True:
        started = engine_core_pids() - before
        family = {p.pid for p in psutil.Process(process.pid).children(recursive=True)}
        if len(started & family) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert len(started & family) >= 2, "two replicas, each with its engine core, under the serving process"
    time.sleep(3)  # mid-request
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=180) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 30
    while any_running(family):
        assert time.monotonic() < deadline, "a replica or vLLM process outlived the serving process"
        time.sleep(1)
