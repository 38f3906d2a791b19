"""The benchmark definition, checked against the strings of NVIDIA's RULER (see shared/ruler.md)."""

import numpy as np
import pytest

from evalkit.ruler import SPECS, TASKS
from evalkit.ruler.kinds.niah import DEPTHS, singular
from evalkit.ruler.spec import NIAH_NEEDLE, NOISE_LINE, TEMPLATES


def test_thirteen_tasks_in_nvidia_order():
    assert TASKS == (
        "niah_single_1",
        "niah_single_2",
        "niah_single_3",
        "niah_multikey_1",
        "niah_multikey_2",
        "niah_multikey_3",
        "niah_multivalue",
        "niah_multiquery",
        "vt",
        "cwe",
        "fwe",
        "qa_1",
        "qa_2",
    )


def test_templates_and_prefixes_are_exact():
    assert TEMPLATES["niah"][:2] == (
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will "
        "quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} "
        "for {query} mentioned in the provided text?",
        " The special magic {type_needle_v} for {query} mentioned in the provided text are",
    )
    assert TEMPLATES["variable_tracking"][:2] == (
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
        "Question: Find all variables that are assigned the value {query} in the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
        "assigned the value {query}, they are: ",
    )
    assert TEMPLATES["common_words_extraction"][:2] == (
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
        "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:",
    )
    assert TEMPLATES["freq_words_extraction"][:2] == (
        "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
        "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
        "What are the three most frequently appeared words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:",
    )
    assert TEMPLATES["qa"][:2] == (
        "Answer the question based on the given documents. Only give me the answer and do not output any other "
        "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
        "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}",
        " Answer:",
    )
    assert NIAH_NEEDLE == "One of the special magic {type_needle_v} for {key} is: {value}."
    assert NOISE_LINE == "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@pytest.mark.parametrize(
    "task, budget, metric",
    [("niah_single_1", 128, "all"), ("vt", 30, "all"), ("cwe", 120, "all"), ("fwe", 50, "all"), ("qa_1", 32, "part")],
)
def test_generation_budgets_and_metrics(task, budget, metric):
    assert SPECS[task].max_new_tokens == budget
    assert SPECS[task].metric == metric


def test_niah_configurations():
    fields = ("haystack", "key_type", "value_type", "num_keys", "num_values", "num_queries")
    shape = {name: tuple(s.params[f] for f in fields) for name, s in SPECS.items() if s.kind == "niah"}
    assert shape == {
        "niah_single_1": ("noise", "words", "numbers", 1, 1, 1),
        "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
        "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
        "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
        "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
        "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
        "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
        "niah_multiquery": ("essay", "words", "numbers", 4, 1, 4),  # keys raised to the number of queries
    }


def test_singular_rewrite():
    template, prefix = TEMPLATES["niah"][:2]
    assert singular(template).format(type_needle_v="number", context="C", query="q") == (
        "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you about "
        "the number afterwards.\nC\nWhat is the special magic number for q mentioned in the provided text?"
    )
    assert singular(prefix).format(type_needle_v="number", query="q") == (
        " The special magic number for q mentioned in the provided text is"
    )


def test_depths_match_numpy_rounding():
    assert DEPTHS == tuple(np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int).tolist())


@pytest.mark.parametrize(
    "content, joined",
    [
        ('{"text": "one two three"}', "one two three"),
        ('["one two", "three four"]', "one two\n\nthree four"),
        ('[{"text": "one two"}, {"content": "three four"}]', "one two\n\nthree four"),
        ("[5]", None),
        ('["one two", null]', None),
        ('[{"body": "one two"}]', None),
    ],
)
def test_essay_json_shapes_read_or_refused_in_one_line(tmp_path, content, joined):
    from evalkit.ruler.essay import EssayError, load_essay_text

    path = tmp_path / "essays.json"
    path.write_text(content)
    if joined is not None:
        assert load_essay_text(path) == joined
        return
    with pytest.raises(EssayError, match="must hold"):
        load_essay_text(path)
