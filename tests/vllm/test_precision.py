"""RoPE options at serving time, on a Qwen2 checkpoint: FP32 rotation, a position shift, a longer window.

One engine: rope="fp32" (a variant to probe: serving=stock), position_shift=SHIFT, max_length
beyond the checkpoint's 1024 positions.
Reference: the transformers model run by hand with position ids shifted by SHIFT, for plain
prompts and for a packed request with the anchor mask written out. In FP32 a small shift would
change nothing (RoPE is relative); at a million, FP32 angles themselves are rounded (their
spacing there is 1/16 rad), so a missing or wrong shift shows in the logits while the same
shift reproduces transformers' to float precision. (The rotation variants' BF16 rounding is
test_rope's.) Needs vLLM.
"""

import pytest
import torch

from evalkit.attention import document_mask
from evalkit.engines import PackedRequest
from evalkit.engines import tokens as tok

from .conftest import MAX_POSITIONS, build_checkpoint, requires_vllm, start_vllm_engine, stop_vllm_engine

pytestmark = requires_vllm

SHIFT = 1_000_000
WINDOW = MAX_POSITIONS + 256  # beyond max_position_embeddings: RoPE tables must grow


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory, tokenizer):
    """(path, transformers model) of a tiny Qwen2 checkpoint (biased q/k/v projections)."""
    from transformers import AutoModelForCausalLM

    path = build_checkpoint(tmp_path_factory.mktemp("tiny-qwen2"), tokenizer, architecture="qwen2", seed=1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    return path, model


@pytest.fixture(scope="module")
def engine(qwen2):
    engine = start_vllm_engine(
        qwen2[0], serving="stock", rope="fp32", position_shift=SHIFT, max_length=WINDOW, batch_size=4, packed=True
    )
    yield engine
    stop_vllm_engine(engine)


@torch.no_grad()
def shifted_logprobs(model, ids: list[int], mask: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probabilities [S, V] of one forward at positions SHIFT .. SHIFT+S-1 (mask: bool [S, S])."""
    positions = torch.arange(SHIFT, SHIFT + len(ids))[None]
    attention_mask = None if mask is None else mask[None, None]
    logits = model(input_ids=torch.tensor([ids]), position_ids=positions, attention_mask=attention_mask).logits[0]
    return logits.log_softmax(-1)


def test_engine_records_the_options(engine):
    info = engine.engine_info()
    assert (info["model_class"], info["rope"], info["position_shift"]) == ("EvalkitQwen2ForCausalLM", "fp32", SHIFT)
    assert info["max_length"] == WINDOW


def test_scores_equal_transformers_at_shifted_positions(engine, qwen2, tokenizer):
    _, model = qwen2
    text = " ".join(["The grass is green. The sky is blue."] * 120)  # ~1.2k tokens: past the trained 1024
    ids = engine.encode(text)[: WINDOW - 1]
    assert len(ids) > MAX_POSITIONS
    context, continuation = ids[:-40], ids[-40:]
    reference = shifted_logprobs(model, ids)
    expected = float(reference[len(context) - 1 : -1].gather(-1, torch.tensor(continuation)[:, None]).sum())
    score, _ = engine.loglikelihood_tokens([(context, continuation)])[0]
    assert score == pytest.approx(expected, abs=1e-3)  # a sum of 40 log-probabilities
    with torch.no_grad():
        unshifted = model(input_ids=torch.tensor([ids])).logits[0].log_softmax(-1)
    unshifted_score = float(unshifted[len(context) - 1 : -1].gather(-1, torch.tensor(continuation)[:, None]).sum())
    assert abs(unshifted_score - score) > 1e-2  # the shift is really applied (see the module docstring)


def test_greedy_answers_equal_transformers_at_shifted_positions(engine, qwen2):
    _, model = qwen2
    for prompt in ["The grass is green.", "Here we go. There and back again. " * 10]:
        ids = engine.encode(prompt)
        generated = []
        for _ in range(12):
            generated.append(int(shifted_logprobs(model, ids + generated)[-1].argmax()))
        expected = engine.tokenizer.decode(generated, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        assert engine.generate([prompt], 12) == [expected]


def test_packed_request_with_the_options(engine, qwen2, tokenizer):
    """Packed documents compose with the RoPE options: anchor mask and shifted positions together."""
    _, model = qwen2
    request = PackedRequest(["The grass is green. " * 8, "One of the magic numbers is 7. " * 6], " The number is")
    layout = tok.packed_layout(tokenizer, request.documents, request.question)
    n, total = layout.num_document_tokens, len(layout.input_ids)
    mask = torch.tril(torch.ones(total, total, dtype=torch.bool))
    mask[:n, :n] = document_mask(torch.tensor(layout.doc_ids), n)
    expected = shifted_logprobs(model, layout.input_ids, mask)[-1]
    torch.testing.assert_close(engine.logits_packed([request])[0], expected, atol=1e-4, rtol=0)
