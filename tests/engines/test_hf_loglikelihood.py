"""Log-likelihoods: equal to sums of token log-probs from plain forwards, greedy flags, rolling windows."""

import pytest

from evalkit.engines import get_engine
from evalkit.errors import UserError
from tests.helpers import full_logits, greedy_without_cache

PAIRS = [
    ("The grass is green.", " The sky is blue."),
    ("One", " two three"),
    ("Some special magic numbers are hidden within the following text.", " Make sure to memorize it."),
    ("Here we go.", " There"),
    ("", "Hello world"),
    ("A", "\n1. word 2. word"),
]


def engine_for(checkpoint, **settings):
    path, _ = checkpoint
    return get_engine("hf", path, dtype="fp32", device="cpu", **settings)


def direct_logprob(model, context: list[int], continuation: list[int]) -> float:
    """sum_t log p(continuation_t | everything before it), from one unpadded forward."""
    logprobs = full_logits(model, context + continuation).double().log_softmax(-1)
    return sum(float(logprobs[len(context) - 1 + t, token]) for t, token in enumerate(continuation))


@pytest.mark.parametrize("prefill", ["shared", "padded"])
def test_loglikelihood_equals_direct_token_logprobs(checkpoint, tokenizer, prefill):
    _, model = checkpoint
    results = engine_for(checkpoint, batch_size=4, prefill=prefill).loglikelihood(PAIRS)
    for (context, continuation), (logprob, _) in zip(PAIRS, results):
        context_ids = tokenizer(context)["input_ids"]  # with the BOS, as a prompt
        whole_ids = tokenizer(context + continuation)["input_ids"]
        assert whole_ids[: len(context_ids)] == context_ids  # these pairs split cleanly
        expected = direct_logprob(model, context_ids, whole_ids[len(context_ids) :])
        assert logprob == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("prefill", ["shared", "padded"])
def test_is_greedy_on_the_models_own_continuation(checkpoint, tokenizer, prefill):
    _, model = checkpoint
    engine = engine_for(checkpoint, prefill=prefill)
    context = tokenizer("The sun is yellow.")["input_ids"]
    greedy = greedy_without_cache(model, context, 6, set())
    not_greedy = greedy[:-1] + [(greedy[-1] + 1) % len(tokenizer)]  # only the last token differs
    (greedy_result, other_result) = engine.loglikelihood_tokens([(context, greedy), (context, not_greedy)])
    assert greedy_result[1] is True
    assert other_result[1] is False
    assert greedy_result[0] > other_result[0]


@pytest.mark.parametrize("prefill", ["shared", "padded"])
def test_batched_loglikelihood_equals_one_at_a_time(checkpoint, prefill):
    one = engine_for(checkpoint, batch_size=1, prefill="padded").loglikelihood(PAIRS)
    batched = engine_for(checkpoint, batch_size=4, prefill=prefill).loglikelihood(PAIRS)
    for (a, greedy_a), (b, greedy_b) in zip(one, batched):
        assert a == pytest.approx(b, abs=1e-5)
        assert greedy_a == greedy_b


def test_empty_continuation_scores_zero(checkpoint):
    assert engine_for(checkpoint).loglikelihood_tokens([([1, 300], [])]) == [(0.0, True)]


def test_over_long_pair_is_an_error_not_a_truncation(checkpoint, tokenizer):
    engine = engine_for(checkpoint, max_length=20)
    context, continuation = [tokenizer.bos_token_id] + [300] * 15, [301] * 6  # 15 + 6 - 1 = 21 tokens fed
    with pytest.raises(UserError, match="context of 16 tokens \\+ continuation of 6 tokens needs 21 tokens"):
        engine.loglikelihood_tokens([(context, continuation)])
    assert engine.loglikelihood_tokens([(context, continuation[:5])])[0] is not None  # exactly 20: fits


def test_rolling_loglikelihood_in_one_window_equals_the_direct_sum(checkpoint, tokenizer):
    _, model = checkpoint
    text = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(tokens) < 128
    expected = direct_logprob(model, [tokenizer.bos_token_id], tokens)
    (rolling,) = engine_for(checkpoint).loglikelihood_rolling([text])
    assert rolling == pytest.approx(expected, abs=1e-4)


def test_rolling_loglikelihood_across_windows_equals_direct_sums(checkpoint, tokenizer):
    _, model = checkpoint
    text = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " * 3
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"][:40]
    text = tokenizer.decode(tokens)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == tokens
    sequence = [tokenizer.bos_token_id, *tokens]
    # Windows of 16 fed tokens, written out: targets 1-16 from the BOS, 17-32 from token 16 on,
    # and the last 8 targets with as much context as fits (tokens 24-32).
    expected = (
        direct_logprob(model, sequence[0:1], sequence[1:17])
        + direct_logprob(model, sequence[16:17], sequence[17:33])
        + direct_logprob(model, sequence[24:33], sequence[33:41])
    )
    rolling = engine_for(checkpoint, max_length=16, batch_size=2).loglikelihood_rolling([text, "", text])
    assert rolling[0] == pytest.approx(expected, abs=1e-4)
    assert rolling[1] == 0.0  # nothing to score
    assert rolling[2] == pytest.approx(rolling[0], abs=1e-6)


def test_scoring_computes_logits_only_for_the_continuation(checkpoint, monkeypatch):
    """Long contexts must not materialise [S, V] logits: only the continuation's positions."""
    engine = engine_for(checkpoint)
    kept = []
    original = engine.model.forward

    def recording_forward(*args, **kwargs):
        out = original(*args, **kwargs)
        kept.append(out.logits.shape[1])
        return out

    monkeypatch.setattr(engine.model, "forward", recording_forward)
    engine.loglikelihood_tokens([([1] + [300] * 50, [301, 302, 303])])
    assert kept == [3]


def test_choices_sharing_a_context_compute_it_once(checkpoint, tokenizer):
    """Multiple choice: four continuations of one context. The shared prefill feeds the context
    once (all but its last token reused by the next choices) and scores every choice as alone."""
    _, model = checkpoint
    engine = engine_for(checkpoint, prefill="shared")
    context = tokenizer("Some special magic numbers are hidden within the following text.")["input_ids"]
    choices = [[300, 301], [302], [300, 305, 306], [310, 311, 312, 313]]
    results = engine.loglikelihood_tokens([(context, choice) for choice in choices])
    for choice, (logprob, _) in zip(choices, results):
        assert logprob == pytest.approx(direct_logprob(model, context, choice), abs=1e-4)
    c = len(context)
    # What is fed is context + choice[:-1], sorted: ctx ([302]), ctx 300, ctx 300 305, ctx 310 311 312.
    # The first computes its c tokens; every other reuses c - 1 (the context's last token is fed again:
    # its logits predict the choice's first token), so computes 2, 3 and 4.
    assert engine.stats.prompt_tokens == c + (c + 1) + (c + 2) + (c + 3)
    assert engine.stats.prefill_tokens == c + 2 + 3 + 4
