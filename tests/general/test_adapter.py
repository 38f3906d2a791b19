"""EngineLM answers lm-eval's requests as a direct computation with the model would, never truncating."""

import pytest
import torch
from lm_eval.api.instance import Instance

from evalkit.general import adapter
from evalkit.general.adapter import EngineLM
from evalkit.general.errors import RequestsExceedWindow, TaskCannotRun
from tests.helpers import direct_logprob

from .conftest import engine_for

PAIRS = [
    ("The grass is green.", " The sky is blue."),
    ("Question: What is 2 + 3?\nAnswer:", " 5"),
    ("Some special magic numbers are hidden within the following text.", " Make sure to memorize it."),
    ("A boy picks up a ball.", " He throws it."),
    ("", "Hello world"),  # lm-eval allows an empty context: the BOS conditions the first token
    ("One", " two three four five six seven"),
]


def requests(kind: str, arguments: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=args, idx=i) for i, args in enumerate(arguments)]


def split_like_a_prompt(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The context as a prompt (with its BOS), the continuation as what the whole text adds to it."""
    context_ids = tokenizer(context)["input_ids"]
    whole_ids = tokenizer(context + continuation)["input_ids"]
    assert whole_ids[: len(context_ids)] == context_ids  # these pairs split cleanly at the boundary
    return context_ids, whole_ids[len(context_ids) :]


def test_loglikelihood_equals_direct_token_logprobs(tiny_run, model, tokenizer):
    lm = EngineLM(engine_for(tiny_run / "step-1", batch_size=4))
    results = lm.loglikelihood(requests("loglikelihood", PAIRS))
    assert len(results) == len(PAIRS)
    for (context, continuation), (logprob, greedy) in zip(PAIRS, results):
        expected, expected_greedy = direct_logprob(model, *split_like_a_prompt(tokenizer, context, continuation))
        assert logprob == pytest.approx(expected, abs=1e-4)
        assert greedy == expected_greedy


def greedy_text(model, tokenizer, context: str, n_tokens: int) -> str | None:
    """The model's own greedy continuation as text, if re-encoding it gives back the same tokens."""
    ids = tokenizer(context)["input_ids"]
    generated = []
    with torch.no_grad():
        for _ in range(n_tokens):
            sequence = ids + generated
            generated.append(int(model(input_ids=torch.tensor([sequence])).logits[0, -1].argmax()))
    text = tokenizer.decode(generated, clean_up_tokenization_spaces=False)
    if any(t in (tokenizer.eos_token_id, tokenizer.bos_token_id) for t in generated):
        return None
    return text if split_like_a_prompt_or_none(tokenizer, context, text) == generated else None


def split_like_a_prompt_or_none(tokenizer, context: str, continuation: str) -> list[int] | None:
    context_ids = tokenizer(context)["input_ids"]
    whole_ids = tokenizer(context + continuation)["input_ids"]
    return whole_ids[len(context_ids) :] if whole_ids[: len(context_ids)] == context_ids else None


def test_is_greedy_true_for_the_models_own_continuation_only(tiny_run, model, tokenizer):
    contexts = ["The sun is", "A man walks", "Python is a", "The cat", "Once upon a time"]
    found = [(c, text) for c in contexts if (text := greedy_text(model, tokenizer, c, 3))]
    assert found, "no context whose greedy continuation survives a decode/encode round trip"
    context, text = found[0]
    other = " zebra" if not text.startswith(" zebra") else " apple"
    lm = EngineLM(engine_for(tiny_run / "step-1"))
    (_, own_greedy), (_, other_greedy) = lm.loglikelihood(
        requests("loglikelihood", [(context, text), (context, other)])
    )
    assert own_greedy is True and other_greedy is False


def test_batched_and_chunked_equal_one_at_a_time(tiny_run, monkeypatch):
    one = EngineLM(engine_for(tiny_run / "step-1", batch_size=1)).loglikelihood(requests("loglikelihood", PAIRS))
    monkeypatch.setattr(
        adapter, "REQUESTS_PER_CALL", 4
    )  # several engine calls, each sorted by length: order must survive
    batched = EngineLM(engine_for(tiny_run / "step-1", batch_size=3)).loglikelihood(requests("loglikelihood", PAIRS))
    for (a, greedy_a), (b, greedy_b) in zip(one, batched):
        assert a == pytest.approx(b, abs=1e-5)
        assert greedy_a == greedy_b


def test_rolling_and_generation_go_through_the_engine(tiny_run):
    engine = engine_for(tiny_run / "step-1", batch_size=2)
    lm = EngineLM(engine)
    texts = ["The grass is green and the sky is blue.", "One two three."]
    rolling = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(t,) for t in texts]))
    assert rolling == pytest.approx(engine.loglikelihood_rolling(texts), abs=1e-6)

    prompts = ["The grass is", "Question: What is 2 + 3?\nAnswer:", "A boy"]
    settings = [{"until": ["\n"], "max_gen_toks": 5}, {"until": "."}, {"until": ["\n"], "max_gen_toks": 5}]
    outputs = lm.generate_until(requests("generate_until", list(zip(prompts, settings))))
    assert outputs[0] == engine.generate([prompts[0]], 5, stop=["\n"])[0]
    assert outputs[1] == engine.generate([prompts[1]], adapter.DEFAULT_MAX_GEN_TOKS, stop=["."])[0]
    assert outputs[2] == engine.generate([prompts[2]], 5, stop=["\n"])[0]


def test_sampling_is_refused(tiny_run):
    lm = EngineLM(engine_for(tiny_run / "step-1"))
    with pytest.raises(TaskCannotRun, match="decode greedily"):
        lm.generate_until(
            requests("generate_until", [("Hi", {"until": ["\n"], "do_sample": True, "temperature": 0.7})])
        )


def test_requests_beyond_the_window_are_counted_and_nothing_runs(tiny_run, tokenizer):
    engine = engine_for(tiny_run / "step-1", max_length=16)
    calls = []
    engine.loglikelihood_tokens = lambda *args, **kwargs: calls.append(args)  # nothing may be scored
    lm = EngineLM(engine)
    long_context = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    pairs = [(long_context, " fifteen"), ("Hi", " there"), (long_context + " and more", " words")]
    with pytest.raises(RequestsExceedWindow) as caught:
        lm.loglikelihood(requests("loglikelihood", pairs))
    details = caught.value.details
    assert (details["requests_over_window"], details["requests"], details["window"]) == (2, 3, 16)
    assert details["longest"] == len(tokenizer(long_context + " and more words")["input_ids"]) - 1
    assert "2 of 3 loglikelihood requests" in caught.value.reason and "never truncates" in caught.value.reason
    assert calls == []

    with pytest.raises(RequestsExceedWindow) as caught:
        lm.generate_until(requests("generate_until", [("Hi", {"until": ["\n"], "max_gen_toks": 20})]))
    details = caught.value.details
    assert details["requests_over_window"] == 1 and details["longest"] == len(tokenizer("Hi")["input_ids"]) + 20
