"""cwe counts (30 vs 3, or 6 vs 1 below 4K) and fwe frequencies decide the answers."""

import re
from collections import Counter
from functools import cache

import pytest

from evalkit.ruler import generate
from tests.helpers import exact_length


@cache
def samples_for(task, length):
    from evalkit.corpus import builtin_tokenizer

    return tuple(generate(task, builtin_tokenizer(), length, 8, seed=5))


def numbered_words(listing):
    """The words of "1. w1 2. w2 ...", checking the labels count up from 1."""
    entries = re.split(r" ?(\d+)\. ", listing)[1:]
    labels, words = entries[0::2], entries[1::2]
    assert labels == [str(i) for i in range(1, len(labels) + 1)]
    return words


@pytest.mark.parametrize("length, common, other", [(2048, 6, 1), (8192, 30, 3)])
def test_cwe_common_words_appear_far_more_often(length, common, other, tokenizer):
    for sample in samples_for("cwe", length):
        main = sample.input.rsplit("Memorize the ones that appear most often.\n", 1)[1]
        listing = main.split("\nQuestion: What are the 10 most common words in the above list?")[0]
        counts = Counter(numbered_words(listing))
        assert {counts[word] for word in sample.outputs} == {common}
        assert set(counts.values()) == {common, other} and len(counts) > 10
        assert sorted(word for word, n in counts.items() if n == common) == sorted(sample.outputs)
        assert sample.length == exact_length(tokenizer, sample)
        assert length - 120 - 40 <= sample.length <= length - 120  # one more word is `other` entries


def test_cwe_demonstration_is_answered():
    sample = samples_for("cwe", 8192)[0]
    demo = sample.input.split("\nBelow is a numbered list of words.", 1)[0]
    listing, answer = demo.split("\nQuestion: What are the 10 most common words in the above list?")
    assert answer.startswith(" Answer: The top 10 words that appear most often in the list are: 1. ")
    top = numbered_words(answer.split("are:", 1)[1])
    counts = Counter(numbered_words(listing.split("most often.\n", 1)[1]))
    assert len(counts) == 40 and {counts[w] for w in top} == {10} and sum(counts.values()) == 10 * 10 + 30 * 3


@pytest.mark.parametrize("length", [2048, 8192])
def test_fwe_frequencies_order_the_answer(length, tokenizer):
    for sample in samples_for("fwe", length):
        body = sample.input.split("Find the three most frequently appeared coded words. ", 1)[1]
        words = body.split("\nQuestion: Do not provide any explanation.")[0].split(" ")
        counts = Counter(words)
        ranked = [word for word, _ in counts.most_common()]
        assert ranked[0] == "..."
        first, second, third = sample.outputs
        assert (
            counts[first]
            > counts[second]
            > counts[third]
            > max(n for word, n in counts.items() if word not in ("...", first, second, third))
        )
        assert all(re.fullmatch(r"[a-z]{6}", word) for word in sample.outputs)
        assert len(counts) - 1 <= (length - 50) // 50  # the vocabulary size
        assert sample.length == exact_length(tokenizer, sample)
        # int(N * k^-alpha / zeta) moves several ranks at once as N grows: steps of up to ~10 words.
        assert length - 50 - 100 <= sample.length <= length - 50
