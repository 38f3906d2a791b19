"""A niah sample's depths say where each answer's needle sits in its text, found again here from
the text alone: for line haystacks, the share of haystack lines before the needle's line; for
essays, the needle's character offset in the essay without its needles (the drawn depth places
it before a sentence, so within a sentence of it)."""

import re

import pytest

from evalkit.ruler import SPECS, generate
from evalkit.ruler.spec import NOISE_LINE, TaskSpec

NEEDLE = re.compile(r"One of the special magic (?:numbers|uuids) for (.+?) is: ([0-9a-f-]+)\.")
SENTENCE = "The quiet river ran past seven old mills today."  # every sentence alike: chars track sentences
ESSAY = " ".join([SENTENCE] * 400)
# Several needles in line haystacks, which RULER's own tasks never have: every key asked in the needle haystack,
# so that the test knows which needle lines are real.
CUSTOM = [
    TaskSpec("noise_4values_2keys", "niah", "all", {"haystack": "noise", "key_type": "words", "value_type": "numbers",
                                                    "num_keys": 2, "num_values": 2, "num_queries": 1}),
    TaskSpec("needle_3keys_all_asked", "niah", "all", {"haystack": "needle", "key_type": "words",
                                                       "value_type": "numbers", "num_keys": 3, "num_values": 2,
                                                       "num_queries": 3}),
]  # fmt: skip
TASKS = [SPECS[name] for name in SPECS if name.startswith("niah")] + CUSTOM


def asked_keys(sample) -> list[str]:
    query = re.search(r" for (.+) mentioned in the provided text (are|is)$", sample.answer_prefix).group(1)
    return re.split(r", and |, ", query)


def line_depths(sample, spec) -> list[float]:
    """Per reference: haystack lines above its needle / haystack lines, in percent."""
    lines = sample.input.split("\n")[1:-1]  # the head and the question around the context's lines
    real = set(asked_keys(sample)) if spec.params["haystack"] == "needle" else None
    is_needle = [bool(m) and (real is None or m[1] in real) for m in map(NEEDLE.fullmatch, lines)]
    if spec.params["haystack"] == "noise":
        assert all(needle or line == NOISE_LINE for needle, line in zip(is_needle, lines))
    haystack = is_needle.count(False)
    depths = []
    for value in sample.outputs:
        (at,) = [i for i, line in enumerate(lines) if is_needle[i] and line.endswith(f" is: {value}.")]
        depths.append(100 * is_needle[:at].count(False) / haystack)
    return depths


def essay_depths(sample) -> list[float]:
    """Per reference: characters of essay above its needle / characters of essay, in percent."""
    context = sample.input.split("\n")[1]
    needles = list(NEEDLE.finditer(context))
    essay_chars = len(context) - sum(len(m[0]) + 1 for m in needles)  # each needle came with one space
    depths = []
    for value in sample.outputs:
        (needle,) = [m for m in needles if m[2] == value]
        before = sum(len(m[0]) + 1 for m in needles if m.start() < needle.start())
        depths.append(100 * (needle.start() - before) / essay_chars)
    return depths, 100 * (len(SENTENCE) + 1) / essay_chars  # within the sentence it was put before


@pytest.mark.parametrize("spec", TASKS, ids=lambda spec: spec.name)
def test_each_reference_depth_is_where_its_needle_is(spec, tokenizer):
    samples = generate(spec, tokenizer, 6000, 6, seed=11, essays=ESSAY)
    for sample in samples:
        assert len(sample.depths) == len(sample.outputs)
        if spec.params["haystack"] == "essay":
            expected, tolerance = essay_depths(sample)
        else:
            expected, tolerance = line_depths(sample, spec), 0.006  # rounded to 2 decimals
        assert sample.depths == pytest.approx(expected, abs=tolerance), sample.index
    spread = [depth for sample in samples for depth in sample.depths]
    assert max(spread) - min(spread) > 30  # drawn over the context, not stuck at one place


def test_other_kinds_record_no_depths(tokenizer):
    assert all(sample.depths is None for sample in generate("vt", tokenizer, 1024, 2))
