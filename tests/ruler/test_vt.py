"""vt: following the assignments from the queried value reaches exactly the answer's variables."""

import re
from functools import cache

import pytest

from evalkit.ruler import generate
from tests.helpers import exact_length

ASSIGNMENT = re.compile(r"^VAR ([A-Z]+) = (VAR ([A-Z]+)|\d+) ?$", re.M)


@cache
def samples_for(length):
    from evalkit.corpus import builtin_tokenizer

    return tuple(generate("vt", builtin_tokenizer(), length, 10, seed=3))


def resolve(text, value):
    """Every variable whose chain of assignments ends at `value`."""
    direct = {}
    for name, rhs, source in ASSIGNMENT.findall(text):
        direct[name] = source or rhs
    found = {name for name, rhs in direct.items() if rhs == value}
    grew = True
    while grew:
        more = {name for name, rhs in direct.items() if rhs in found}
        grew = not more <= found
        found |= more
    return found


@pytest.mark.parametrize("length", [2048, 6000])
def test_chain_resolves_to_the_answer(length, tokenizer):
    for sample in samples_for(length):
        value = re.search(r"assigned the value (\d+) in the text above\.$", sample.input).group(1)
        assert sample.answer_prefix == (
            " Answer: According to the chain(s) of variable assignment in the text above, 5 variables are assigned "
            f"the value {value}, they are: "
        )
        task_part = sample.input.split("\n\nMemorize and track", 1)[1]
        assert resolve(task_part, value) == set(sample.outputs)
        assert len(sample.outputs) == 5 and all(re.fullmatch(r"[A-Z]{5}", name) for name in sample.outputs)
        # The chain is in order: each variable is assigned after the one it copies.
        positions = [task_part.index(f"\nVAR {name} = ") for name in sample.outputs]
        assert positions == sorted(positions)
        assert sample.length == exact_length(tokenizer, sample) and length - 30 - 40 <= sample.length <= length - 30


def test_one_answered_demonstration_comes_first():
    for sample in samples_for(2048):
        demo, rest = sample.input.split("\n\nMemorize and track", 1)
        assert demo.startswith(
            "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
        )
        match = re.search(r"assigned the value (\d+), they are:  ([A-Z]{3}(?: [A-Z]{3}){4})$", demo)
        assert match, demo[-200:]
        assert resolve(demo, match.group(1)) == set(match.group(2).split())
        assert match.group(1) not in rest  # the demonstration's value is not the question's
