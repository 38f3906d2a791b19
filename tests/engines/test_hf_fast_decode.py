"""The hf engine's fast decoding step (engines/fast_decode.py) against transformers' own forward.

Two engines on the same checkpoint, fast_decode on and off, answer the same prompts: the greedy
texts must be equal and the logits of every decoding step equal bit for bit (so the per-token
log-probabilities are too: the fast step performs the same operations on the same shapes, so
no fp32 round-off is allowed). Batches are padded (RULER prompts of one task differ in length,
plus one prompt cut short) and rows finish at different steps (a stop string), so the padding
mask, row dropping and the no-padding case all run. Models the step does not implement must
decode through transformers and say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from evalkit.engines import get_engine
from evalkit.engines.base import PackedRequest
from tests.helpers import build_checkpoint, decode, greedy_without_cache, write_qa_files

SHIPPED = Path(__file__).resolve().parents[2] / "evalkit/checkpoints/tiny-long"
SHIPPED_RUNS = ("tiny-long-anchor-shipped", "tiny-long-full-shipped", "tiny-long-intra_doc-shipped")
# Every RULER task kind (ruler/kinds/) at 1K; cwe at 2K, the shortest it fits with this tokenizer.
ONE_TASK_PER_KIND = (("niah_multikey_1", 1024), ("vt", 1024), ("cwe", 2048), ("fwe", 1024), ("qa_1", 1024))


@pytest.fixture(scope="module")
def qa_dir(tmp_path_factory) -> Path:
    """SQuAD v2 dev (qa_1's dataset) and HotpotQA files in the real formats, from offline prose."""
    return write_qa_files(tmp_path_factory.mktemp("qa"))


@pytest.fixture(scope="module")
def ruler_cache(tmp_path_factory) -> Path:
    """One RULER data cache for the module: the shipped runs share their tokenizer."""
    return tmp_path_factory.mktemp("ruler-cache")


def _shipped_checkpoint(run: str) -> Path:
    return sorted((SHIPPED / run).glob("step-*"))[-1]  # the last of its checkpoints


def recorded_steps(engine) -> list[torch.Tensor]:
    """Make `engine` record the logits [rows, V] of every decoding step it takes from now on."""
    steps: list[torch.Tensor] = []
    original = engine._decode_step

    def recording(state, next_tokens):
        state = original(state, next_tokens)
        steps.append(state.logits.clone())
        return state

    engine._decode_step = recording
    return steps


def assert_same_answers(path: Path, run, **settings) -> None:
    """`run(engine)` on fast_decode on and off: equal texts, bit-equal logits at every step."""
    fast = get_engine("hf", path, dtype="fp32", device="cpu", **settings)
    slow = get_engine("hf", path, dtype="fp32", device="cpu", fast_decode=False, **settings)
    assert fast.engine_info()["decode_path"] == "fast", fast.engine_info()["decode_path_reason"]
    assert slow.engine_info()["decode_path"] == "transformers"
    fast_steps, slow_steps = recorded_steps(fast), recorded_steps(slow)
    assert run(fast) == run(slow)
    assert len(fast_steps) == len(slow_steps) > 0
    for fast_logits, slow_logits in zip(fast_steps, slow_steps):
        assert torch.equal(fast_logits, slow_logits)
        assert torch.equal(fast_logits.log_softmax(-1), slow_logits.log_softmax(-1))


def ruler_prompts(path: Path, task: str, length: int, qa_files: Path, cache_dir: Path) -> list[str]:
    from evalkit.models.check import load_tokenizer
    from evalkit.ruler.cache import load_or_generate

    samples = load_or_generate(task, load_tokenizer(path), length, 2, 42, cache_dir=cache_dir, qa_dir=qa_files)
    prompts = [s.input + s.answer_prefix for s in samples]
    return [*prompts, prompts[0][: len(prompts[0]) // 3]]  # a short row: padding in the batch for sure


@pytest.mark.parametrize("run", SHIPPED_RUNS)
def test_shipped_checkpoints_answer_every_ruler_kind_at_1k_identically(run, qa_dir, ruler_cache):
    from evalkit.ruler.spec import task_spec

    path = _shipped_checkpoint(run)
    for task, length in ONE_TASK_PER_KIND:
        prompts = ruler_prompts(path, task, length, qa_dir, ruler_cache)
        budget = task_spec(task).max_new_tokens

        def answers(engine, prompts=prompts, budget=budget):
            plain = engine.generate(prompts, budget)
            stopped = engine.generate(prompts, budget, stop=["."])  # rows leave the batch at different steps
            return plain, stopped

        assert_same_answers(path, answers, batch_size=8)


def test_padded_prefill_and_packed_requests_decode_identically(qa_dir, ruler_cache):
    path = _shipped_checkpoint("tiny-long-anchor-shipped")
    prompts = ruler_prompts(path, "niah_single_1", 1024, qa_dir, ruler_cache)
    assert_same_answers(path, lambda engine: engine.generate(prompts, 40), batch_size=3, prefill="padded")
    requests = [
        PackedRequest(documents=["The grass is green. " * n, "The key is 12345. " * 2], question=" What is the key?")
        for n in (1, 5, 9)
    ]  # documents of different lengths: holes in the middle of the cache
    assert_same_answers(path, lambda engine: engine.generate_packed(requests, 24), batch_size=3)


def test_grouped_query_model_answers_as_the_loop_without_a_cache(checkpoint, tokenizer):
    """The engines' tiny test model has 4 query heads over 2 key-value heads (the grouped attention
    path); the fast engine also matches the plain no-cache greedy loop, an independent reference."""
    path, model = checkpoint  # one row alone below: no padding, SDPA takes no mask
    prompts = [[tokenizer.bos_token_id, *range(300, 300 + n)] for n in (3, 17, 40, 9)]
    assert_same_answers(path, lambda engine: [engine.generate(p, 12) for p in (prompts, prompts[:1])], batch_size=4)
    outputs = get_engine("hf", path, dtype="fp32", device="cpu", batch_size=4).generate(prompts, 12)
    for ids, output in zip(prompts, outputs):
        assert output == decode(tokenizer, greedy_without_cache(model, ids, 12, {tokenizer.eos_token_id}))


@pytest.mark.parametrize(
    ("architecture", "changes", "reason"),
    [
        ("mistral", {"sliding_window": 16}, "MistralForCausalLM is not LlamaForCausalLM"),
        ("qwen2", {}, "Qwen2ForCausalLM is not LlamaForCausalLM"),
        ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}, "rope_param"),
        ("llama", {"layer_types": ["full_attention", "full_attention"]}, "config field 'layer_types'"),
    ],
)
def test_models_it_does_not_implement_decode_through_transformers(tokenizer, tmp_path, architecture, changes, reason):
    model = build_checkpoint(tmp_path, tokenizer, architecture, **changes)
    engine = get_engine("hf", tmp_path, dtype="fp32", device="cpu", batch_size=2)
    info = engine.engine_info()
    assert info["decode_path"] == "transformers"
    assert reason in info["decode_path_reason"]
    prompts = [[tokenizer.bos_token_id, *range(300, 300 + n)] for n in (5, 11)]
    model.set_attn_implementation("sdpa")
    for ids, output in zip(prompts, engine.generate(prompts, 8)):
        assert output == decode(tokenizer, greedy_without_cache(model, ids, 8, {tokenizer.eos_token_id}))


def test_hooks_cuda_and_other_attention_are_refused(checkpoint):
    from evalkit.attention.hf import set_rope_precision
    from evalkit.engines import fast_decode

    path, _ = checkpoint
    engine = get_engine("hf", path, dtype="fp32", device="cpu")
    model = engine.model
    assert fast_decode.refusal(model, torch.device("cpu"), "sdpa", True) is None
    assert "device cuda" in fast_decode.refusal(model, torch.device("cuda"), "sdpa", True)
    assert "attention 'eager'" in fast_decode.refusal(model, torch.device("cpu"), "eager", True)
    assert "not plain full attention" in fast_decode.refusal(model, torch.device("cpu"), "sdpa", False)
    set_rope_precision(model, "fp32")  # a forward hook on the rotary module: the fast step would skip it
    assert "forward hooks" in fast_decode.refusal(model, torch.device("cpu"), "sdpa", True)


def test_fast_decode_false_reaches_the_engine_from_the_command_line(checkpoint):
    from evalkit.engines.args import OWN_FLAGS, parse_engine_args

    assert parse_engine_args("hf", ["fast_decode=false"], OWN_FLAGS) == {"fast_decode": False}
    path, _ = checkpoint
    info = get_engine("hf", path, dtype="fp32", device="cpu", fast_decode=False).engine_info()
    assert (info["decode_path"], info["decode_path_reason"]) == ("transformers", "fast_decode=false")


@pytest.mark.real
def test_real_smollm2_answers_identically(smollm2, qa_dir, tmp_path):
    """30 layers, 9 query heads over 3 key-value heads, RoPE base 1e5: the grouped SDPA at decoding."""
    prompts = ruler_prompts(smollm2, "niah_single_1", 1024, qa_dir, tmp_path)
    assert_same_answers(smollm2, lambda engine: engine.generate(prompts, 24), batch_size=4)
