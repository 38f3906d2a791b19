"""The vllm engine equals the hf engine: greedy RULER answers, log-likelihoods, and packed anchor requests.

One vLLM engine is shared by the module; its prefill chunk budget is small (128 tokens) so RULER
prompts and packed documents are split across steps, which the anchor backend must handle. The
reference is the hf engine on the same checkpoint, in the same dtype (conftest.ENGINE_DTYPE).
fp32 (the CPU default) compares greedy texts exactly and log-probabilities to 1e-4; bf16 (CUDA, or
EVALKIT_VLLM_TEST_DTYPE=bf16) compares teacher-forced instead (tests/vllm/agreement.py says why
and with what tolerance). Needs vLLM: run in the vLLM environment (.venv-vllm).
"""

import functools

import pytest
import torch

from evalkit.engines import PackedRequest
from evalkit.engines import tokens as tok
from evalkit.errors import UserError
from evalkit.ruler import load_or_generate
from evalkit.ruler.spec import task_spec

from . import agreement
from .conftest import ENGINE_DTYPE, LOGPROB_ATOL, MAX_POSITIONS, requires_vllm, start_vllm_engine, stop_vllm_engine

pytestmark = requires_vllm
BF16 = ENGINE_DTYPE == "bf16"  # teacher-forced comparisons instead of free-running texts (module docstring)

CHUNK = 128  # max_num_batched_tokens: every prompt here takes several prefill steps
RULER_CASES = [  # (task, length): the tasks that fit these lengths with the built-in tokenizer
    ("niah_single_1", 512), ("niah_multikey_2", 512), ("niah_multivalue", 512), ("fwe", 512),
    ("niah_single_1", 1024), ("niah_multivalue", 1024), ("vt", 1024),
]  # fmt: skip
DOCUMENTS = [
    "The grass is green. The sky is blue. The sun is yellow. Here we go. " * 6,
    "There and back again. One of the special magic numbers for alpha is: 7. " * 5,
    "Memorize the numbers. The sky is blue. " * 8,
]
QUESTION = " What is the special magic number for alpha? The number is"


@pytest.fixture(scope="module")
def engine(checkpoint):
    engine = start_vllm_engine(checkpoint, batch_size=4, max_num_batched_tokens=CHUNK, packed=True)
    yield engine
    stop_vllm_engine(engine)


def ruler_prompts(tokenizer, task: str, length: int, samples: int = 2) -> list[str]:
    return [s.input + s.answer_prefix for s in load_or_generate(task, tokenizer, length, samples, 42)]


# ---------------------------------------------------------------------- plain requests


@pytest.mark.parametrize("task, length", RULER_CASES)
def test_ruler_greedy_answers_equal_the_hf_engine(engine, hf_engine, tokenizer, task, length):
    prompts = ruler_prompts(tokenizer, task, length)
    max_new_tokens = task_spec(task).max_new_tokens
    if BF16:
        assert (
            agreement.plain_agreement(engine, hf_engine.model, [engine.encode(p) for p in prompts], max_new_tokens)
            == []
        )
        return
    assert engine.generate(prompts, max_new_tokens) == hf_engine.generate(prompts, max_new_tokens)


def test_answers_come_back_in_request_order_though_submitted_sorted(engine, hf_engine, tokenizer):
    """Requests go to vLLM sorted by token ids (prefix-cache neighbours); each answer must still be its own."""
    prompts = ruler_prompts(tokenizer, "niah_single_2", 512, samples=4)
    shuffled = [prompts[2], "Zebra", prompts[0], prompts[3], "A", prompts[1], prompts[2]]
    if BF16:  # one batch through the same sorting: a swapped answer would score another text
        assert agreement.plain_agreement(engine, hf_engine.model, [engine.encode(p) for p in shuffled], 16) == []
        return
    assert engine.generate(shuffled, 16) == hf_engine.generate(shuffled, 16)


def test_stop_strings_cut_like_the_hf_engine(engine, hf_engine, tokenizer):
    prompts = ruler_prompts(tokenizer, "niah_single_1", 512) + ["The grass is green.", "Hello"]
    # bf16: the free-running texts of the two engines part, so vLLM's stop handling is held to the
    # rule the hf engine applies (cut before the earliest stop string) on vLLM's own unstopped text.
    unstopped = engine.generate(prompts, 40) if BF16 else None
    for stop in (["\n"], ["e", "a"], ["The"]):
        expected = [tok.cut_at_stop(t, stop) for t in unstopped] if BF16 else hf_engine.generate(prompts, 40, stop=stop)
        assert engine.generate(prompts, 40, stop=stop) == expected


def loglikelihood_pairs(tokenizer) -> list[tuple[str, str]]:
    """RULER contexts with their true answers, and short pairs."""
    samples = load_or_generate("niah_multivalue", tokenizer, 512, 2, 42)
    pairs = [(s.input + s.answer_prefix, " " + " ".join(s.outputs)) for s in samples]
    return [*pairs, ("The grass is", " green"), ("One two", " three four five"), ("Hello", " world.")]


def greedy_token_ids(model, context: list[int], steps: int) -> list[int]:
    """The model's own greedy continuation, in tokens (text would be re-tokenized differently)."""
    ids = list(context)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(context) :]


def test_loglikelihoods_agree_within_1e_4(engine, hf_engine, tokenizer):
    pairs = loglikelihood_pairs(tokenizer)
    if BF16:
        check_loglikelihoods_in_bf16(engine, hf_engine, tokenizer, pairs)
        return
    ours, reference = engine.loglikelihood(pairs), hf_engine.loglikelihood(pairs)
    for (score, greedy), (expected, expected_greedy) in zip(ours, reference):
        assert score == pytest.approx(expected, abs=LOGPROB_ATOL)
        assert greedy == expected_greedy
    context = engine.encode("The sky is")
    greedy_request = [(context, greedy_token_ids(hf_engine.model, context, 6))]
    assert engine.loglikelihood_tokens(greedy_request)[0][1] is True
    assert engine.loglikelihood_tokens(greedy_request)[0][0] == pytest.approx(
        hf_engine.loglikelihood_tokens(greedy_request)[0][0], abs=LOGPROB_ATOL
    )
    texts = [" ".join(["The grass is green."] * 300)]  # 1.5k tokens: several rolling windows
    # A sum over ~1.5K tokens of per-token differences of a few 1e-6 (fp32 kernels of another ISA:
    # 1.0e-3 measured on an AMX Xeon); a misplaced window would change it by whole units.
    assert engine.loglikelihood_rolling(texts)[0] == pytest.approx(hf_engine.loglikelihood_rolling(texts)[0], abs=1e-2)


def check_loglikelihoods_in_bf16(engine, hf_engine, tokenizer, pairs) -> None:
    """Each pair's tokens teacher-forced; the public sums and greedy flags where bf16 can decide them."""
    requests = [tok.encode_pair(tokenizer, context, continuation) for context, continuation in pairs]
    answers = engine._run(*agreement.scoring_inputs(engine, *zip(*requests)))
    for answer, (context, continuation) in zip(answers, requests):
        assert agreement.plain_disagreements(answer, hf_engine.model, context, continuation) == []
    for (score, greedy), (expected, expected_greedy), (context, continuation) in zip(
        engine.loglikelihood(pairs), hf_engine.loglikelihood(pairs), requests
    ):
        assert score == pytest.approx(expected, abs=agreement.BF16_TOLERANCE * len(continuation))
        _, margins = agreement.reference_scores(hf_engine.model, context, continuation)
        if bool((margins.abs() > agreement.BF16_TOLERANCE).all()):
            assert greedy == expected_greedy
    # In bf16 the per-token differences of ~1.5K tokens do not cancel: relative to the sum instead
    # (a misplaced window is off by whole units per token, far more).
    texts = [" ".join(["The grass is green."] * 300)]
    expected = hf_engine.loglikelihood_rolling(texts)[0]
    assert engine.loglikelihood_rolling(texts)[0] == pytest.approx(expected, abs=2e-2 * abs(expected))


def test_requests_beyond_the_window_are_refused_never_truncated(engine, tokenizer):
    too_long = [300] * (MAX_POSITIONS - 3)
    with pytest.raises(UserError, match=f"prompt of {MAX_POSITIONS - 3} tokens \\+ 8 new tokens"):
        engine.generate([too_long], 8)
    with pytest.raises(UserError, match="more than the model window"):
        engine.loglikelihood_tokens([([300] * MAX_POSITIONS, [301, 302])])
    # Exactly the window: the scoring request feeds MAX_POSITIONS tokens, vLLM's window has one more.
    assert engine.loglikelihood_tokens([([300] * (MAX_POSITIONS - 1), [301, 302])])[0] is not None


def test_engine_info_records_the_settings(engine, tokenizer, checkpoint):
    from evalkit.corpus import tokenizer_fingerprint

    info = engine.engine_info()
    assert (info["engine"], info["dtype"], info["batch_size"], info["max_length"]) == (
        "vllm",
        ENGINE_DTYPE,
        4,
        MAX_POSITIONS,
    )
    assert (info["tensor_parallel_size"], info["data_parallel_size"]) == (1, 1)
    assert info["model_class"] == "EvalkitLlamaForCausalLM"
    assert (info["rope"], info["position_shift"], info["max_num_batched_tokens"]) == ("cast", 0, CHUNK)
    assert info["vllm_max_model_len"] == MAX_POSITIONS + 1
    assert info["model_path"] == str(checkpoint.resolve())
    assert info["tokenizer_fingerprint"] == tokenizer_fingerprint(tokenizer)
    from evalkit.engines.base import RESULT_FACTS

    assert all(info.get(fact) is not None for fact in RESULT_FACTS)  # what results are compared by


# ---------------------------------------------------------------------- packed requests


def test_packed_request_equals_the_hf_anchor_forward(engine, hf_engine):
    """Three documents behind one anchor: next-token distribution and greedy answer as the hf engine's."""
    request = PackedRequest(DOCUMENTS, QUESTION)
    if BF16:
        assert agreement.packed_agreement(engine, hf_engine, engine.tokenizer, [request], 16) == []
        return
    logprobs = engine.logits_packed([request])
    torch.testing.assert_close(logprobs, hf_engine.logits_packed([request]).log_softmax(-1), atol=LOGPROB_ATOL, rtol=0)
    assert engine.generate_packed([request], 16) == hf_engine.generate_packed([request], 16)


def test_packed_request_differs_from_stock_attention_over_the_same_tokens(engine, hf_engine, tokenizer):
    request = PackedRequest(DOCUMENTS, QUESTION)
    layout = tok.packed_layout(tokenizer, request.documents, request.question)
    packed = engine.logits_packed([request])[0]
    # The same tokens as a plain request: stock causal attention, as hf's plain forward computes it.
    plain_score = engine.loglikelihood_tokens([(layout.input_ids, [int(packed.argmax())])])[0][0]
    with torch.no_grad():
        causal = hf_engine.model(input_ids=torch.tensor([layout.input_ids])).logits[0, -1].log_softmax(-1)
    assert plain_score == pytest.approx(float(causal[int(packed.argmax())]), abs=LOGPROB_ATOL)
    # The documents no longer see each other: further apart than the dtype's noise (in bf16, the two
    # engines' own differences reach 0.28: agreement.py).
    assert (packed - causal).abs().max() > (agreement.BF16_TOLERANCE if BF16 else 1e-2)


def test_a_document_seeing_another_fails_the_bf16_comparison(engine, hf_engine, tokenizer):
    """The bf16 comparison can fail: against a reference whose documents see each other (stock causal
    attention over the same tokens), the vLLM engine's anchor distributions are far outside its tolerance."""
    request = PackedRequest(DOCUMENTS, QUESTION)
    continuations, reference = agreement.reference_packed(hf_engine, tokenizer, [request], 12)
    prefixes = agreement.prefixes(tokenizer, [request], continuations)
    ours, tokens = engine.logits_packed(prefixes), continuations[0]
    layout = tok.packed_layout(tokenizer, request.documents, prefixes[-1].question)
    question_start = layout.num_document_tokens
    with torch.no_grad():
        logits = hf_engine.model(input_ids=torch.tensor([layout.input_ids])).logits[0].float()
    # Row i: after the question and i continuation tokens, as the anchor rows are.
    first = question_start + len(prefixes[0].question) - 1
    wrong_mask = logits[first : first + len(tokens)].log_softmax(-1)
    assert agreement.distribution_disagreements(ours, reference, tokens) == []
    wrong = agreement.distribution_disagreements(ours, wrong_mask, tokens)
    assert [problem for problem in wrong if "log p" in problem], "the bf16 comparison let a wrong mask pass"


def test_batched_packed_requests_of_different_layouts(engine, hf_engine):
    requests = [
        PackedRequest(DOCUMENTS, QUESTION),
        PackedRequest(DOCUMENTS[::-1], QUESTION),  # same documents, another order: another layout
        PackedRequest(["A", "B"], " C"),
        PackedRequest([[300, 301, 302] * 20, "Some text."], [304, 305]),
    ]
    if BF16:
        assert agreement.packed_agreement(engine, hf_engine, engine.tokenizer, requests, 12) == []
        return
    torch.testing.assert_close(
        engine.logits_packed(requests), hf_engine.logits_packed(requests).log_softmax(-1), atol=LOGPROB_ATOL, rtol=0
    )
    assert engine.generate_packed(requests, 12) == hf_engine.generate_packed(requests, 12)


def test_plain_and_packed_requests_in_one_batch(engine, hf_engine, tokenizer):
    """Rows move as requests finish at different times: each keeps its own attention."""
    packed_requests = [PackedRequest(DOCUMENTS, QUESTION), PackedRequest(["A", "B"], " C")]
    plain = ruler_prompts(tokenizer, "niah_single_1", 512) + ["The grass is green."]
    if BF16:
        check_mixed_batch_in_bf16(engine, hf_engine, tokenizer, packed_requests, plain)
        return
    packed_prompts, packed_params = engine._packed_inputs(
        [engine._checked_layout(request, 20) for request in packed_requests],
        functools.partial(engine._greedy, 20),
    )
    lengths = [40, 3, 20]  # different max_tokens: requests leave the batch at different steps
    plain_prompts = [{"prompt_token_ids": engine.encode(p)} for p in plain]
    plain_params = [engine._greedy(n) for n in lengths]
    answers = engine._run(
        [packed_prompts[0], *plain_prompts, packed_prompts[1]], [packed_params[0], *plain_params, packed_params[1]]
    )
    texts = [engine._text(answer, []) for answer in answers]
    assert [texts[0], texts[-1]] == hf_engine.generate_packed(packed_requests, 20)
    assert texts[1:-1] == [hf_engine.generate([p], n)[0] for p, n in zip(plain, lengths)]


def check_mixed_batch_in_bf16(engine, hf_engine, tokenizer, packed_requests, plain) -> None:
    """One batch: every teacher-forced prefix of the packed requests (one step each) among plain
    requests scored teacher-forced that go on decoding for 40, 3 and 20 steps."""
    continuations, reference = agreement.reference_packed(hf_engine, tokenizer, packed_requests, 8)
    prefixes = agreement.prefixes(tokenizer, packed_requests, continuations)
    packed_prompts, packed_params = engine._packed_inputs(
        [engine._checked_layout(prefix, 1) for prefix in prefixes],
        functools.partial(engine._greedy, 1, logprobs=-1),
    )
    contexts = [engine.encode(p) for p in plain]
    plain_continuations = [agreement.reference_continuation(hf_engine.model, c, 12) for c in contexts]
    plain_prompts, plain_params = agreement.scoring_inputs(engine, contexts, plain_continuations, [40, 3, 20])
    half = len(packed_prompts) // 2
    answers = engine._run(
        packed_prompts[:half] + plain_prompts + packed_prompts[half:],
        packed_params[:half] + plain_params + packed_params[half:],
    )
    packed_answers = answers[:half] + answers[half + len(plain) :]
    rows = torch.full((len(packed_answers), reference.shape[1]), float("-inf"))
    for row, answer in zip(rows, packed_answers):
        row[torch.tensor(list(answer.first_step))] = torch.tensor(list(answer.first_step.values()))
    assert agreement.distribution_disagreements(rows, reference, [t for c in continuations for t in c]) == []
    for answer, context, continuation in zip(answers[half : half + len(plain)], contexts, plain_continuations):
        assert agreement.plain_disagreements(answer, hf_engine.model, context, continuation) == []


def test_prefix_cache_never_mixes_packed_and_plain_blocks(engine, hf_engine, tokenizer):
    """The same tokens plain, packed, plain again: cached blocks of one kind are never reused by the other."""
    request = PackedRequest(DOCUMENTS, QUESTION)
    layout = tok.packed_layout(tokenizer, request.documents, request.question)
    if BF16:  # a reused block of the other kind would move log-probs by whole units (see the bf16 negative check)
        for _ in range(2):
            assert agreement.plain_agreement(engine, hf_engine.model, [layout.input_ids], 10) == []
            assert agreement.packed_agreement(engine, hf_engine, tokenizer, [request], 10) == []
        return
    plain_first = engine.generate([layout.input_ids], 10)
    assert engine.generate_packed([request], 10) == hf_engine.generate_packed([request], 10)
    assert engine.generate([layout.input_ids], 10) == plain_first == hf_engine.generate([layout.input_ids], 10)


def test_over_long_packed_request_is_an_error_naming_the_lengths(engine):
    request = PackedRequest([[300] * 600, [301] * 400], [302, 303])
    with pytest.raises(UserError, match=r"packed request of 1005 tokens \(1003 for the anchor and 2 documents"):
        engine.generate_packed([request], max_new_tokens=30)


def test_settings_are_checked_before_vllm_starts(checkpoint):
    from evalkit.engines import get_engine

    with pytest.raises(UserError, match="rope must be one of cast, fp32"):
        get_engine("vllm", checkpoint, rope="bf16")
    with pytest.raises(UserError, match="position_shift must be non-negative"):
        get_engine("vllm", checkpoint, position_shift=-1)
    with pytest.raises(UserError, match="data_parallel_size must be at least 1"):
        get_engine("vllm", checkpoint, data_parallel_size=0)
    with pytest.raises(UserError, match="unknown setting.*device"):
        get_engine("vllm", checkpoint, device="cpu")
