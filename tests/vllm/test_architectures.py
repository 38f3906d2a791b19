"""evalkit's vLLM model class for Mistral checkpoints (Llama is test_engine's, Qwen2 test_precision's).

Plain greedy answers and a packed request equal the hf engine's on the same checkpoint (in bf16:
teacher-forced, as agreement.py says). Needs vLLM.
"""

import pytest
import torch

from evalkit.engines import PackedRequest, get_engine
from evalkit.ruler import load_or_generate

from . import agreement
from .conftest import (
    ENGINE_DEVICE,
    ENGINE_DTYPE,
    LOGPROB_ATOL,
    build_checkpoint,
    requires_vllm,
    start_vllm_engine,
    stop_vllm_engine,
)

pytestmark = requires_vllm


@pytest.fixture(scope="module")
def mistral(tmp_path_factory, tokenizer):
    return build_checkpoint(tmp_path_factory.mktemp("tiny-mistral"), tokenizer, architecture="mistral", seed=2)


@pytest.fixture(scope="module")
def engines(mistral):
    engine = start_vllm_engine(mistral, batch_size=4, packed=True)
    yield engine, get_engine("hf", mistral, dtype=ENGINE_DTYPE, device=ENGINE_DEVICE, batch_size=4)
    stop_vllm_engine(engine)


def test_mistral_serves_like_the_hf_engine(engines, tokenizer):
    engine, hf_engine = engines
    assert engine.engine_info()["model_class"] == "EvalkitMistralForCausalLM"
    prompts = [s.input + s.answer_prefix for s in load_or_generate("niah_multikey_2", tokenizer, 512, 3, 42)]
    request = PackedRequest(["The grass is green. " * 10, "The sky is blue. " * 7, "Seven."], " Which color?")
    if ENGINE_DTYPE == "bf16":
        assert agreement.plain_agreement(engine, hf_engine.model, [engine.encode(p) for p in prompts], 64) == []
        assert agreement.packed_agreement(engine, hf_engine, tokenizer, [request], 12) == []
        return
    assert engine.generate(prompts, 64) == hf_engine.generate(prompts, 64)
    torch.testing.assert_close(
        engine.logits_packed([request]), hf_engine.logits_packed([request]).log_softmax(-1), atol=LOGPROB_ATOL, rtol=0
    )
    assert engine.generate_packed([request], 12) == hf_engine.generate_packed([request], 12)
