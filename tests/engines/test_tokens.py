"""Token layouts shared by every engine: pair splits, rolling windows, packed layout, stop cuts."""

import pytest

from evalkit.attention import pack
from evalkit.engines import tokens as tok
from evalkit.errors import UserError


@pytest.mark.parametrize("num_tokens, max_length", [(1, 8), (7, 8), (8, 8), (9, 8), (40, 16), (33, 16), (100, 7)])
def test_rolling_windows_score_every_token_once_within_the_window(num_tokens, max_length):
    tokens = list(range(10, 10 + num_tokens))
    prefix = 1
    sequence = [prefix, *tokens]
    windows = tok.rolling_windows(tokens, prefix, max_length)
    scored = [t for _, continuation in windows for t in continuation]
    assert scored == tokens  # each token once, in order
    position = 1
    for context, continuation in windows:
        fed = context + continuation[:-1]
        assert 1 <= len(fed) <= max_length
        # the context is exactly the text right before the continuation
        assert sequence[position - len(context) : position] == context
        position += len(continuation)


def test_rolling_windows_give_the_last_window_a_full_context():
    windows = tok.rolling_windows(list(range(10, 50)), 1, 16)  # 40 tokens, windows of 16
    sequence = [1, *range(10, 50)]
    assert windows == [
        (sequence[0:1], sequence[1:17]),
        (sequence[16:17], sequence[17:33]),
        (sequence[24:33], sequence[33:41]),  # 8 targets fed with 16 - 8 extra tokens of context
    ]


def test_rolling_windows_match_lm_evaluation_harness():
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    tokens = list(range(10, 110))
    for max_length in (5, 16, 99, 100, 101, 400):
        theirs = [
            make_disjoint_window(w)
            for w in get_rolling_token_windows(tokens, prefix_token=1, max_seq_len=max_length, context_len=1)
        ]
        assert tok.rolling_windows(tokens, 1, max_length) == [(list(a), list(b)) for a, b in theirs]


def test_pair_split_moves_trailing_spaces_to_the_continuation(tokenizer):
    context, continuation = tok.encode_pair(tokenizer, "The capital of France is ", "Paris")
    assert context == tokenizer("The capital of France is")["input_ids"]  # with its BOS
    whole = tokenizer("The capital of France is Paris")["input_ids"]
    assert context + continuation == whole


def test_pair_with_empty_context_conditions_on_the_bos(tokenizer):
    context, continuation = tok.encode_pair(tokenizer, "", "Hello world")
    assert context == [tokenizer.bos_token_id]
    assert continuation == tokenizer("Hello world", add_special_tokens=False)["input_ids"]


def test_packed_layout_is_the_anchor_paradigms_layout(tokenizer):
    documents = ["The sky is blue.", [300, 301, 302]]
    layout = tok.packed_layout(tokenizer, documents, " What color is the sky?")
    doc_ids = [tokenizer("The sky is blue.", add_special_tokens=False)["input_ids"], [300, 301, 302]]
    n = 1 + sum(len(d) + 1 for d in doc_ids)
    reference = pack(doc_ids, n, "anchor", bos_id=tokenizer.bos_token_id, eos_id=tokenizer.eos_token_id)
    question = tokenizer(" What color is the sky?", add_special_tokens=False)["input_ids"]
    assert layout.input_ids == reference.input_ids.tolist() + question
    assert layout.doc_ids == reference.doc_ids.tolist()
    assert layout.num_document_tokens == n
    assert layout.question_ids == question
    assert layout.input_ids[0] == tokenizer.bos_token_id and layout.input_ids.count(tokenizer.bos_token_id) == 1


@pytest.mark.parametrize("documents, question", [([], "q"), (["a", ""], "q"), (["a"], "")])
def test_packed_layout_refuses_empty_parts(tokenizer, documents, question):
    with pytest.raises(UserError):
        tok.packed_layout(tokenizer, documents, question)


def test_cut_at_the_earliest_stop():
    assert tok.cut_at_stop("abc\n\nQ: next", ["Q:", "\n\n"]) == "abc"
    assert tok.cut_at_stop("abc", ["x", ""]) == "abc"
    assert tok.cut_at_stop("abc", []) == "abc"
