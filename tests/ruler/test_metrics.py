import pytest

from evalkit.ruler import postprocess, sample_score, score


def test_postprocess_strips_and_turns_control_characters_into_newlines():
    assert postprocess("  a\tb\x00c\x1fd \n") == "a\nb\nc\nd"


def test_string_match_all_by_hand():
    # sample 1: 2 of 3 found (case-insensitive); sample 2: 1 of 1; sample 3: 0 of 2
    predictions = ["Values: 123 and ABC-def", "x 9", "nothing"]
    references = [["123", "abc-DEF", "777"], ["9"], ["a1", "b2"]]
    assert score("niah_multivalue", predictions, references) == round((2 / 3 + 1 + 0) / 3 * 100, 2) == 55.56


def test_string_match_part_by_hand():
    predictions = ["The answer is Paris.", "london", "no idea"]
    references = [["paris", "Lyon"], ["Rome", "LONDON"], ["Oslo"]]
    assert score("qa_1", predictions, references) == 66.67


def test_control_characters_split_words_before_matching():
    # "ab" joined by a tab does not match "a b", and a NUL inside a reference-looking string breaks it
    assert sample_score("vt", "AAAAA\x00BBBBB", ["AAAAA", "BBBBB"]) == 100.0
    assert sample_score("vt", "AAA\x00AA", ["AAAAA"]) == 0.0
    assert sample_score("qa_2", "Yes\tno", ["yes no"]) == 0.0


def test_per_sample_scores_average_to_the_task_score():
    predictions = ["a b", "a", ""]
    references = [["a", "b"], ["a", "b"], ["a"]]
    per_sample = [sample_score("cwe", p, r) for p, r in zip(predictions, references)]
    assert per_sample == [100.0, 50.0, 0.0]
    assert score("cwe", predictions, references) == round(sum(per_sample) / 3, 2)


def test_bad_inputs_are_errors():
    with pytest.raises(ValueError):
        score("cwe", ["a"], [["a"], ["b"]])
    with pytest.raises(ValueError):
        score("cwe", [], [])
    with pytest.raises(ValueError):
        score("cwe", ["a"], [[]])


def test_standard_error_by_hand():
    from evalkit.ruler.metrics import standard_error

    # niah_multivalue (match_all over 4 values): per-sample scores 100, 50, 0, 25 -> mean 43.75,
    # sample variance (56.25^2 + 6.25^2 + 43.75^2 + 18.75^2) / 3 = 5468.75 / 3, se = sqrt(5468.75 / 3 / 4) = 21.35.
    refs = [["1", "2", "3", "4"]] * 4
    predictions = ["1 2 3 4", "1 2", "none", "3"]
    assert standard_error("niah_multivalue", predictions, refs) == 21.35
    assert standard_error("niah_single_1", ["7"], [["7"]]) == 0.0
    assert standard_error("niah_single_1", ["7", "7"], [["7"], ["7"]]) == 0.0
