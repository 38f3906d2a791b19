"""niah_*: every answer is a needle value next to its queried key; lengths fill the budget from below."""

import re
from functools import cache

import pytest

from evalkit.ruler import SPECS, generate
from evalkit.ruler.spec import NOISE_LINE
from tests.helpers import exact_length

NIAH = [task for task in SPECS if task.startswith("niah")]
LENGTHS = (2048, 6000)
NEEDLE = re.compile(r"One of the special magic (numbers|uuids) for (.+?) is: ([0-9a-f-]+)\.")


def unit_tokens(tokenizer, haystack):
    """A sample lands below its budget by less than one haystack unit (a word, a line, a needle line)."""
    if haystack == "essay":
        return 32  # one essay word, however long, plus the junction it opens
    unit = {
        "noise": "\n" + NOISE_LINE,
        "needle": "\nOne of the special magic uuids for 0673f722-8837-446a-8abb-0818ad7671ff is: "
        "86428c8e-9f67-4635-8f8b-1514c130d9f4.",
    }[haystack]
    return len(tokenizer(unit, add_special_tokens=False)["input_ids"])


@cache
def samples_for(task, length):
    from evalkit.corpus import builtin_tokenizer

    return tuple(generate(task, builtin_tokenizer(), length, 12, seed=7))


def queried_keys(sample):
    query = re.search(r" for (.+) mentioned in the provided text (are|is)$", sample.answer_prefix).group(1)
    return re.split(r", and |, ", query)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("task", NIAH)
def test_answers_are_the_values_of_the_queried_keys(task, length):
    params = SPECS[task].params
    for sample in samples_for(task, length):
        needles = NEEDLE.findall(sample.input)
        values_by_key = {}
        for _, key, value in needles:
            values_by_key.setdefault(key, []).append(value)
        keys = queried_keys(sample)
        assert len(keys) == params["num_queries"]
        expected = [value for key in keys for value in values_by_key[key]]
        assert sorted(expected) == sorted(sample.outputs)  # no distractor shares a queried key
        assert len(sample.outputs) == params["num_queries"] * params["num_values"]
        for key, value in zip([k for k in keys for _ in range(params["num_values"])], sample.outputs):
            assert f"for {key} is: {value}." in sample.input
            if params["value_type"] == "numbers":
                assert re.fullmatch(r"[1-9]\d{6}", value)
            else:
                assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", value)


@pytest.mark.parametrize("task", NIAH)
def test_lengths_are_exact_and_fill_the_budget_from_below(task, tokenizer):
    slack = unit_tokens(tokenizer, SPECS[task].params["haystack"])
    for length in LENGTHS:
        budget = length - 128
        for sample in samples_for(task, length):
            assert sample.length == exact_length(tokenizer, sample)
            assert budget - slack <= sample.length <= budget


@pytest.mark.parametrize("task", NIAH)
def test_template_is_singular_only_for_one_value_of_one_key(task):
    sample = samples_for(task, 2048)[0]
    params = SPECS[task].params
    shown = params["value_type"][:-1] if params["num_values"] * params["num_queries"] == 1 else params["value_type"]
    if shown.endswith("s"):
        assert sample.input.startswith(f"Some special magic {shown} are hidden within the following text.")
        assert sample.answer_prefix.endswith("mentioned in the provided text are")
    else:
        assert sample.input.startswith(f"A special magic {shown} is hidden within the following text.")
        assert sample.answer_prefix.endswith("mentioned in the provided text is")
    assert sample.input.endswith("mentioned in the provided text?")


def test_noise_haystack_is_the_noise_line_around_the_needle():
    for sample in samples_for("niah_single_1", 2048):
        context = sample.input.split("afterwards.\n", 1)[1].rsplit("\nWhat is the special", 1)[0]
        lines = context.split("\n")
        needles = [line for line in lines if line.startswith("One of the special magic")]
        assert len(needles) == 1 and len(lines) > 20
        assert all(line == NOISE_LINE for line in lines if line not in needles)


def test_essay_needles_sit_between_sentences():
    for sample in samples_for("niah_multikey_1", 6000):
        context = sample.input.split("afterwards.\n", 1)[1]
        for match in NEEDLE.finditer(context):
            before, after = context[: match.start()], context[match.end() :]
            at_end = after.startswith("\nWhat ") or re.match(r" One of the special magic numbers", after)
            assert before == "" or at_end or re.search(r"[.!?][\"')\]\u201d\u2019]* $", before), before[-40:]


def test_sample_index_is_the_position_in_the_list():
    assert [sample.index for sample in samples_for("niah_single_2", 2048)] == list(range(12))
