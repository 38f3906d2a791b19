"""Plain requests on vLLM's own path: an engine not started for packed requests runs vLLM's own
attention backend and model runner, with no evalkit logits processor, and says so in engine_info
(read back from vLLM's registry and configuration, not from evalkit's constants). A packed engine
started after it takes evalkit's backend, and a plain one after that gets vLLM's back.
Needs vLLM: run in the vLLM environment (.venv-vllm).
"""

import pytest

from evalkit.engines import PackedRequest
from evalkit.errors import UserError
from evalkit.ruler import load_or_generate
from evalkit.ruler.spec import task_spec

from . import agreement
from .conftest import ENGINE_DTYPE, requires_vllm, start_vllm_engine, stop_vllm_engine

pytestmark = requires_vllm

STOCK_CPU_BACKEND = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"  # vLLM's CPU_ATTN class
EVALKIT_CPU_BACKEND = "evalkit.vllm_plugin.backend_cpu.AnchorCPUAttentionBackend"


def plain_answers_equal_hf(engine, hf_engine, tokenizer) -> None:
    for task in ("niah_single_1", "niah_multivalue"):
        prompts = [s.input + s.answer_prefix for s in load_or_generate(task, tokenizer, 512, 3, 42)]
        budget = task_spec(task).max_new_tokens
        if ENGINE_DTYPE == "bf16":  # teacher-forced (agreement.py: free-running bf16 texts part)
            assert agreement.plain_agreement(engine, hf_engine.model, [engine.encode(p) for p in prompts], budget) == []
            continue
        assert engine.generate(prompts, budget) == hf_engine.generate(prompts, budget)


def test_plain_then_packed_then_plain_engines_select_their_backends(checkpoint, hf_engine, tokenizer):
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the backend classes named here are the CPU ones")
    plain = start_vllm_engine(checkpoint, batch_size=4)
    try:
        info = plain.engine_info()
        assert (info["packed"], info["packed_attention"]) == (False, None)
        assert info["attention_backend"] == STOCK_CPU_BACKEND
        assert "logits_processors" not in plain._options and "attention_backend" not in plain._options
        plain_answers_equal_hf(plain, hf_engine, tokenizer)
        with pytest.raises(UserError, match="started for plain requests.*packed=True"):
            plain.generate_packed([PackedRequest(["A", "B"], " C")], 4)
        with pytest.raises(UserError, match="started for plain requests"):
            plain.logits_packed([PackedRequest(["A", "B"], " C")])
        with pytest.raises(UserError, match="started for plain requests"):  # ppl's anchor encoding
            plain.token_logprobs([[tokenizer.bos_token_id, 10, 11]], [[0, 1, 1]])
    finally:
        stop_vllm_engine(plain)

    packed = start_vllm_engine(checkpoint, batch_size=4, packed=True)
    try:
        info = packed.engine_info()
        assert (info["packed"], info["model_runner"]) == (True, "V1")
        assert info["attention_backend"] == EVALKIT_CPU_BACKEND
        request = PackedRequest(["The grass is green.", "The sky is blue."], " Which color?")
        if ENGINE_DTYPE == "bf16":
            assert agreement.packed_agreement(packed, hf_engine, tokenizer, [request], 8) == []
        else:
            assert packed.generate_packed([request], 8) == hf_engine.generate_packed([request], 8)
    finally:
        stop_vllm_engine(packed)

    plain_again = start_vllm_engine(checkpoint, batch_size=4)
    try:
        assert plain_again.engine_info()["attention_backend"] == STOCK_CPU_BACKEND
        plain_answers_equal_hf(plain_again, hf_engine, tokenizer)
    finally:
        stop_vllm_engine(plain_again)
