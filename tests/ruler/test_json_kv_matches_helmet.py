"""json_kv's samples and scores equal HELMET's JSON-KV, reimplemented here from its definition
(HELMET data.py load_json_kv, utils.py substring_exact_match_score / normalize_answer /
parse_output, configs/recall_short.yaml: 2 shots; the object as lost-in-the-middle writes it);
each sample fills its token budget, and its recorded depth is where the queried key sits."""

import random
import re
import string
import uuid
from functools import cache

import pytest

from evalkit.models.check import load_tokenizer
from evalkit.ruler import generate, sample_score, score
from evalkit.ruler.context import Context
from evalkit.ruler.encoding import split_sample
from evalkit.ruler.generation import counter_for
from evalkit.ruler.kinds import generator_class
from evalkit.ruler.metrics import normalize_answer, parse_output
from evalkit.ruler.prompt import BASE
from evalkit.ruler.spec import task_spec
from tests.sweep.helpers import SHIPPED_FULL

SPEC = task_spec("json_kv")
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@cache
def shipped_tokenizer():
    return load_tokenizer(SHIPPED_FULL / "step-600")


# HELMET's definition, written out (not evalkit's code).
def helmet_prompt(records: list[tuple[str, str]], key: str, demos: list[tuple[str, str]]) -> str:
    body = ""
    for i, (k, v) in enumerate(records):
        body += ("{" if i == 0 else " ") + f'"{k}": "{v}"' + (",\n" if i < len(records) - 1 else "}")
    shots = "\n\n".join(f"Key: {k}\nCorresponding value:{' ' + v}" for k, v in demos) + ("\n\n" if demos else "")
    user = "{context}\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n"
    user += "{demos}Key: {question}"
    return (user + "\n" + "Corresponding value:").format(context="JSON data:\n" + body, demos=shots, question=key)


def helmet_normalize(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def helmet_parse(output: str, prefix: str = "corresponding value:") -> str:
    for pattern in (re.compile(f"(?:{prefix})(.*)(?:\n|$)", re.IGNORECASE), re.compile(r"(?:^)(.*)(?:\n|$)")):
        found = pattern.search(output)
        if found is not None:
            return re.sub(f"^{re.escape(prefix)}", "", found[1].strip(), flags=re.IGNORECASE).strip()
    raise AssertionError("the first-line pattern always matches")


def helmet_subem(prediction: str, answer: str) -> float:
    return float(
        max(helmet_normalize(answer) in helmet_normalize(text) for text in (prediction, helmet_parse(prediction)))
    )


def parsed(sample) -> tuple[list[tuple[str, str]], str, list[tuple[str, str]]]:
    """(the object's records, the queried key as asked, the demonstrations) read back from the text."""
    obj = sample.input[len("JSON data:\n") : sample.input.index("}\n\nExtract")]
    records = re.findall(rf'"({UUID})": "({UUID})"', obj)
    demos = re.findall(rf"Key: (\"{UUID}\")\nCorresponding value: ({UUID})\n\n", sample.input)
    key = re.search(rf'Key: ("{UUID}")\Z', sample.input)
    assert key is not None
    return records, key[1], demos


@pytest.mark.parametrize("length", [512, 1024, 2048])
def test_samples_are_helmets_prompt_of_their_own_pairs(length):
    samples = generate("json_kv", shipped_tokenizer(), length, 25, seed=3)
    sizes = set()
    for sample in samples:
        records, key, demos = parsed(sample)
        assert sample.input + sample.answer_prefix == helmet_prompt(records, key, demos)
        assert len(demos) == 2  # HELMET's shots
        keys = [k for k, _ in records] + [k.strip('"') for k, _ in demos]
        assert len(set(keys)) == len(keys)  # demonstrations' keys are not in the object; no key twice
        assert all(uuid.UUID(x).version == 4 for pair in records + demos for x in pair if x[0] != '"')
        assert sample.outputs == [dict(records)[key.strip('"')]]
        sizes.add(len(records))
    assert min(sizes) > 1  # pairs beside the queried one (how many: test_samples_fill_the_budget)


def test_subem_is_helmets_on_hand_picked_and_random_predictions():
    (sample,) = generate("json_kv", shipped_tokenizer(), 1024, 1, seed=0)
    value = sample.outputs[0]
    records, _, _ = parsed(sample)
    wrong = next(v for _, v in records if v != value)
    hand = {
        f" {value}": 1,
        f" {value.upper()}.": 1,  # case and punctuation
        f'"{value}"\n\nKey: "x"': 1,
        f"the {value.replace('-', '')}": 1,  # punctuation dropped on both sides; the article too
        f"\n{value}": 1,  # a correct value after a newline
        f"Corresponding value: {value[:-1]}\nCorresponding value: {value}": 1,
        f" {wrong}": 0,  # a wrong value
        f" {value[:-2]}": 0,
        "": 0,
        "\n": 0,
    }
    rng = random.Random(0)
    noisy = [
        rng.choice(["", " ", "\n", "The value is ", "Corresponding value:", "an "])
        + rng.choice([value, wrong, value.upper(), value[:20], "a " + value])
        + rng.choice(["", ".", "\n", "\nKey: x", "!"])
        for _ in range(200)
    ]
    for prediction, expected in hand.items():
        assert helmet_subem(prediction, value) == expected, prediction
        assert sample_score(SPEC, prediction, [value]) == 100.0 * expected, prediction
    predictions = [*hand, *noisy]
    for prediction in predictions:
        assert sample_score(SPEC, prediction, [value]) == 100.0 * helmet_subem(prediction, value), prediction
    expected = round(sum(helmet_subem(p, value) for p in predictions) / len(predictions) * 100, 2)
    assert score("json_kv", predictions, [[value]] * len(predictions)) == expected
    assert 0 < expected < 100 and SPEC.metric_name == "substring_exact_match"


def test_normalize_and_parse_are_helmets():
    """Each part of the metric alone (the parsed line rarely changes a SubEM score, so the score
    comparison above alone would not show a difference there)."""
    rng = random.Random(1)
    parts = ["Corresponding value:", "corresponding VALUE: ", "\n", " ", "The", "an", "a", "x-y", "!?", "Key:", "é"]
    outputs = ["".join(rng.choice(parts) for _ in range(rng.randint(0, 8))) for _ in range(500)]
    for output in outputs:
        assert normalize_answer(output) == helmet_normalize(output), output
        assert parse_output(output, "corresponding value:") == helmet_parse(output), output


@pytest.mark.parametrize("length", [512, 1024])
def test_samples_fill_the_budget(length):
    """Within length - 100, and the next pair the object would take overflows it wherever the queried
    record then sits: the pairs of a sample at 4K begin with those of the same sample here."""
    tokenizer = shipped_tokenizer()
    budget = length - SPEC.max_new_tokens
    here = generate("json_kv", tokenizer, length, 6, seed=5)
    longer = generate("json_kv", tokenizer, 4096, 6, seed=5)
    for short, long in zip(here, longer):
        assert short.length == len(tokenizer(short.input + short.answer_prefix)["input_ids"]) <= budget
        records, key, demos = parsed(short)
        others = [pair for pair in records if f'"{pair[0]}"' != key]
        queried = next(pair for pair in records if f'"{pair[0]}"' == key)
        more = [pair for pair in parsed(long)[0] if f'"{pair[0]}"' != key]
        assert more[: len(others)] == others
        grown = others + [more[len(others)]]
        tokens = [
            len(tokenizer(helmet_prompt([*grown[:i], queried, *grown[i:]], key, demos))["input_ids"])
            for i in range(len(grown) + 1)
        ]
        assert min(tokens) > budget


def test_the_recorded_depth_is_where_the_queried_key_sits():
    tokenizer = shipped_tokenizer()
    ctx = Context(SPEC, counter_for(tokenizer), 2048, 7, BASE)
    generator = generator_class("json_kv")(ctx)
    depths = []
    for sample in generate("json_kv", tokenizer, 2048, 30, seed=7):
        records, key, _ = parsed(sample)
        where = [f'"{k}"' for k, _ in records].index(key)
        depth = generator.plan(sample.index).answer_depths(len(records))
        assert depth == [pytest.approx(100 * where / (len(records) - 1))]
        depths.append(depth[0])
    assert min(depths) < 20 and max(depths) > 80  # drawn over the whole object


def test_anchor_documents_are_whole_records():
    """--encoding anchor cuts json_kv's context at line breaks (its default pieces): every document
    ends at a record's end, so no record is split across two documents."""
    tokenizer = shipped_tokenizer()
    (sample,) = generate("json_kv", tokenizer, 4096, 1, seed=0)
    split = split_sample(sample, SPEC, tokenizer, 256)
    assert split.text() == sample.input + sample.answer_prefix and len(split.documents) > 3
    assert all(document.endswith('",\n') for document in split.documents[:-1])
    assert split.documents[-1].endswith('"}') and split.question.startswith("\n\nExtract the value")
