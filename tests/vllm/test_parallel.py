"""tensor_parallel_size and data_parallel_size reach vLLM and change nothing in the answers.

Data parallelism runs two replicas in child processes; tensor parallelism splits every layer's
heads over two workers, each with its own packed-request tracker. On a CPU, vLLM needs its
OpenMP threads bound by hand for two workers (VLLM_CPU_OMP_THREADS_BIND), one core each.
Several engine starts: marked slow. Needs vLLM.
"""

import os

import pytest
import torch

from evalkit.engines import PackedRequest

from .conftest import LOGPROB_ATOL, requires_vllm, start_vllm_engine, stop_vllm_engine

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
def test_parallel_engines_answer_like_the_hf_engine(checkpoint, hf_engine, two_cpu_workers, setting):
    engine = start_vllm_engine(checkpoint, batch_size=4, packed=True, **{setting: 2})
    try:
        assert engine.engine_info()[setting] == 2
        assert engine.generate(PROMPTS, 10) == hf_engine.generate(PROMPTS, 10)
        torch.testing.assert_close(
            engine.logits_packed(PACKED), hf_engine.logits_packed(PACKED).log_softmax(-1), atol=LOGPROB_ATOL, rtol=0
        )
    finally:
        stop_vllm_engine(engine)
