"""Token counts as users write them, and the one-line errors for what is not one."""

import pytest

from evalkit.errors import UserError
from evalkit.lengths import MAX_LENGTH, length_label, parse_length, parse_lengths


def test_plain_and_k_lengths():
    assert parse_lengths("4k, 8K,16384") == [4096, 8192, 16384]
    assert parse_length(str(MAX_LENGTH)) == 999_999_999 and parse_length("0004096") == 4096


@pytest.mark.parametrize("text", ["1000000000", "976563k", "9" * 5000])
def test_a_length_over_the_limit_names_the_limit(text):
    with pytest.raises(UserError, match=f"is above evalkit's limit of {MAX_LENGTH} tokens"):
        parse_length(text)


@pytest.mark.parametrize("text", ["0", "4q", "-5", "²", "1.5k", ""])
def test_what_is_not_a_positive_integer_says_so(text):
    with pytest.raises(UserError, match="use a positive integer such as 4096 or 4k"):
        parse_length(text)


@pytest.mark.parametrize("length, label", [(4096, "4K"), (131072, "128K"), (1000, "1000"), (1536, "1536")])
def test_labels_read_back_as_the_length(length, label):
    assert length_label(length) == label and parse_length(label.lower()) == length
