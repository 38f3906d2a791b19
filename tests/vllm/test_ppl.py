"""`evalkit ppl`'s vLLM scoring (prompt_logprobs) against the hf engine's on the same documents:
each token's log-probability within the engines' tolerance (conftest.LOGPROB_ATOL: 1e-4 in fp32)."""

from __future__ import annotations

import math
import random

import pytest

from evalkit import ppl
from tests.vllm.conftest import LOGPROB_ATOL, requires_vllm, start_vllm_engine, stop_vllm_engine

pytestmark = requires_vllm


@pytest.fixture(scope="module")
def engine(checkpoint):
    started = start_vllm_engine(checkpoint, max_length=1024)
    yield started
    stop_vllm_engine(started)


def test_vllm_token_logprobs_equal_the_hf_engine_per_token(engine, hf_engine, tokenizer):
    draw = random.Random(0)
    rows = [[tokenizer.bos_token_id, *(draw.randrange(10, 2000) for _ in range(length - 1))] for length in (700, 700)]
    served, reference = engine.token_logprobs(rows), hf_engine.token_logprobs(rows)
    for got, want in zip(served, reference):
        assert len(got) == len(want) == 699
        assert max(abs(a - b) for a, b in zip(got, want)) <= LOGPROB_ATOL
    nll = [-sum(lp) / len(lp) for lp in served], [-sum(lp) / len(lp) for lp in reference]
    assert math.exp(sum(nll[0]) / 2) == pytest.approx(math.exp(sum(nll[1]) / 2), rel=1e-4)


@pytest.fixture(scope="module")
def packed_engine(checkpoint):
    started = start_vllm_engine(checkpoint, max_length=1024, packed=True)
    yield started
    stop_vllm_engine(started)


def test_vllm_anchor_logprobs_equal_the_hf_engine_per_token(packed_engine, hf_engine, tokenizer):
    """--encoding anchor: the packed layout's prompt log-probabilities through evalkit's backend, the
    pieces' first tokens (read at the EOS before them) among them, against the hf engine's."""
    draw = random.Random(1)
    rows = [[tokenizer.bos_token_id, *(draw.randrange(10, 2000) for _ in range(599))] for _ in range(2)]
    served = ppl.anchor_logprobs(packed_engine, rows, 128)
    reference = ppl.anchor_logprobs(hf_engine, rows, 128)
    for got, want in zip(served, reference):
        assert len(got) == len(want) == 599
        assert max(abs(a - b) for a, b in zip(got, want)) <= LOGPROB_ATOL
    standard = hf_engine.token_logprobs(rows)  # not the same numbers: the pieces are read apart
    assert max(abs(a - b) for a, b in zip(reference[0], standard[0])) > 10 * LOGPROB_ATOL
