"""`sizing="nvidia"`: NVIDIA's once-per-length haystack size, stepped down per sample on overflow.

The default (`exact`) must stay byte-identical, with unchanged cache keys; nvidia sizing must never
exceed the budget, fill less on average, share one size per task and length except where a sample
overflowed it, and never be served from (or into) the exact cache.
"""

import hashlib
import json
import math
import re
import warnings
from dataclasses import asdict

import pytest

from evalkit.errors import UserError
from evalkit.ruler import SPECS, TASKS, generate, load_or_generate
from evalkit.ruler import generation as generate_module
from evalkit.ruler.cache import cache_key, cache_path
from evalkit.ruler.fitting import Coarse, TooLong, shared_size, step_down
from evalkit.ruler.runner import RulerSettings
from evalkit.ruler.spec import GENERATOR_VERSION, NOISE_LINE
from tests.helpers import exact_length

# Made by the generator before sizings existed (6 samples, seed 3). Sample hashes hold for the
# built-in tokenizer below. A GENERATOR_VERSION bump changes them on purpose: record the new values then.
BUILTIN_FINGERPRINT = "5bf130c590ebe058"
EXACT_BEFORE = {
    ("niah_single_1", 1024): "fa94daa9857e47ba",
    ("niah_multikey_1", 2048): "4607bc32716d1cd6",
    ("niah_multikey_2", 1024): "3644698acd4db87e",
    ("vt", 2048): "b5f339c22f1c4cea",
    ("cwe", 5000): "d33a5dce89b79d70",
    ("fwe", 1024): "cfd497ed1bcf74ac",
}


def fill(samples, task: str, length: int) -> float:
    budget = length - SPECS[task].max_new_tokens
    return sum(sample.length for sample in samples) / (len(samples) * budget)


def essay_words(sample) -> int:  # essay words plus a constant (template and needle words)
    return len(sample.input.split())


def noise_lines(sample) -> int:
    return sample.input.count(NOISE_LINE)


def documents(sample) -> int:
    return len(re.findall(r"(?m)^Document \d+:$", sample.input))


def test_exact_samples_are_byte_identical_to_before(tokenizer):
    from evalkit.corpus import tokenizer_fingerprint

    if tokenizer_fingerprint(tokenizer) != BUILTIN_FINGERPRINT:
        pytest.skip("the built-in tokenizer differs from the one the hashes were recorded with")
    assert GENERATOR_VERSION == 1, "the stored hashes are version 1's: record the new ones"
    for (task, length), sample_hash in EXACT_BEFORE.items():
        samples = generate(task, tokenizer, length, 6, seed=3)
        # As the samples were written then: without the needles' depths recorded since.
        before = "".join(json.dumps({k: v for k, v in asdict(s).items() if k != "depths"}, ensure_ascii=False,
                                    sort_keys=True) + "\n" for s in samples)  # fmt: skip
        assert hashlib.sha256(before.encode()).hexdigest()[:16] == sample_hash, task
        assert generate(task, tokenizer, length, 6, seed=3, sizing="exact") == samples


def test_exact_is_the_default_for_qa(tokenizer, qa_dir):
    for task in ("qa_1", "qa_2"):
        default = generate(task, tokenizer, 2048, 4, seed=3, qa_dir=qa_dir)
        assert generate(task, tokenizer, 2048, 4, seed=3, qa_dir=qa_dir, sizing="exact") == default


@pytest.mark.parametrize("task", TASKS)
def test_nvidia_sizing_never_exceeds_the_budget(task, tokenizer, qa_dir):
    length = 8192 if task == "cwe" else 3000  # cwe does not fit 3000 or 4096 with this tokenizer
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # composed counts hold: no fallback to full tokenisation
        samples = generate(task, tokenizer, length, 8, seed=5, qa_dir=qa_dir, sizing="nvidia")
    assert len(samples) == 8
    for sample in samples:
        assert sample.outputs and all(sample.outputs)
        assert sample.length == exact_length(tokenizer, sample)
        assert sample.length + SPECS[task].max_new_tokens <= length


@pytest.mark.parametrize("length", [2048, 4096])
def test_nvidia_fills_less_than_exact(length, tokenizer):
    task = "niah_multikey_1"
    exact = generate(task, tokenizer, length, 12)
    nvidia = generate(task, tokenizer, length, 12, sizing="nvidia")
    assert fill(exact, task, length) > 0.98
    assert fill(nvidia, task, length) < fill(exact, task, length) - 0.05
    assert min(s.length for s in nvidia) < min(s.length for s in exact)


@pytest.mark.parametrize(
    "task, length, step, size",
    [
        ("niah_single_1", 8192, 25, noise_lines),
        ("niah_multikey_1", 2048, 500, essay_words),
        ("niah_multivalue", 4096, 500, essay_words),
        ("vt", 8192, 10, noise_lines),
        ("qa_2", 4096, 10, documents),
    ],
)
def test_samples_share_the_searched_size_unless_they_overflow(task, length, step, size, tokenizer, qa_dir):
    exact = generate(task, tokenizer, length, 12, qa_dir=qa_dir)
    nvidia = generate(task, tokenizer, length, 12, qa_dir=qa_dir, sizing="nvidia")
    # The size is searched on the first sample: it lands where exact sizing puts it.
    assert nvidia[0] == exact[0]
    shared = size(nvidia[0])
    for e, v in zip(exact, nvidia):
        largest = size(e)  # the largest size at which this sample fits
        if largest >= shared:
            assert size(v) == shared
        else:  # it overflowed the shared size: down by whole steps until it fits
            assert size(v) == shared - math.ceil((shared - largest) / step) * step
        # Same random choices in both sizings: only the haystack size differs.
        assert (v == e) == (size(v) == largest)
        assert v.outputs == e.outputs and v.answer_prefix == e.answer_prefix
    assert any(size(v) == shared for v in nvidia[1:])


def test_below_one_step_a_sample_takes_its_largest_fit(tokenizer):
    """At 1K an essay holds fewer than 500 words: NVIDIA's loop would never end on an overflow."""
    exact = generate("niah_multikey_1", tokenizer, 1024, 12)
    nvidia = generate("niah_multikey_1", tokenizer, 1024, 12, sizing="nvidia")
    shared = essay_words(nvidia[0])
    assert shared < 500
    overflowed = [(e, v) for e, v in zip(exact, nvidia) if essay_words(e) < shared]
    assert overflowed and all(v == e for e, v in overflowed)
    assert all(essay_words(v) == shared for e, v in zip(exact, nvidia) if essay_words(e) >= shared)


class LinearPlan:
    """A plan whose prompt costs 100 + 10 tokens per unit plus a per-sample offset."""

    min_size, max_size, prefix, outputs = 1, None, "", ["x"]

    def __init__(self, offset: int = 0):
        self.offset = offset

    def estimate(self, size: int) -> int:
        return 100 + 10 * size + self.offset

    def guess(self, budget: int) -> int:
        return max(1, budget // 10)

    def items(self, size: int) -> list:
        return []


def test_shared_size_and_step_down_on_a_linear_plan():
    plan = LinearPlan()
    measure = plan.estimate
    assert shared_size(plan, 1000, measure, Coarse(25)) == 90  # the largest fit
    # fwe's grid: climbed from the origin in steps, the last that fits; one step below when the origin does not.
    assert shared_size(plan, 1000, measure, Coarse(7, origin=50)) == 85
    assert shared_size(plan, 1000, measure, Coarse(7, origin=120)) == 113
    heavier = LinearPlan(offset=55)  # fits 84 units
    assert step_down(heavier, 1000, heavier.estimate, 90, 25) == (65, 805)
    assert step_down(plan, 1000, measure, 90, 25) == (90, 1000)
    assert step_down(LinearPlan(offset=700), 1000, LinearPlan(offset=700).estimate, 90, 25) == (15, 950)
    # Below one step (where NVIDIA's loop never ends): the largest size that fits.
    heavy = LinearPlan(offset=840)
    assert step_down(heavy, 1000, heavy.estimate, 20, 25) == (6, 1000)
    with pytest.raises(TooLong):
        step_down(LinearPlan(offset=900), 1000, LinearPlan(offset=900).estimate, 20, 25)


def test_nvidia_full_tokenisation_fallback_keeps_the_sizing(tokenizer, monkeypatch):
    composed = generate("niah_multivalue", tokenizer, 4096, 6, sizing="nvidia")
    monkeypatch.setattr(generate_module, "_composed_counts_hold", lambda ctx, samples: False)
    with pytest.warns(UserWarning, match="tokenising every prompt in full"):
        tokenised = generate("niah_multivalue", tokenizer, 4096, 6, sizing="nvidia")
    assert tokenised == composed


def test_cache_keys_and_files_differ_between_sizings(tokenizer, tmp_path):
    task, length = "niah_multikey_1", 2048
    exact_key = cache_key(task, tokenizer, length, 42)
    nvidia_key = cache_key(task, tokenizer, length, 42, sizing="nvidia")
    assert exact_key[0] == nvidia_key[0] and exact_key[1] != nvidia_key[1]
    assert cache_path(task, tokenizer, length, cache_dir=tmp_path) != cache_path(
        task, tokenizer, length, cache_dir=tmp_path, sizing="nvidia"
    )
    exact = load_or_generate(task, tokenizer, length, 5, cache_dir=tmp_path)
    nvidia = load_or_generate(task, tokenizer, length, 5, cache_dir=tmp_path, sizing="nvidia")
    assert nvidia != exact and nvidia == generate(task, tokenizer, length, 5, sizing="nvidia")
    assert load_or_generate(task, tokenizer, length, 5, cache_dir=tmp_path) == exact  # each from its own file
    assert len(list(tmp_path.rglob("*.jsonl"))) == 2


def test_settings_key_the_sizing_into_the_sample_log(tokenizer):
    from dataclasses import asdict

    exact, nvidia = RulerSettings(), RulerSettings(sizing="nvidia")
    assert asdict(nvidia)["sizing"] == "nvidia" and asdict(exact)["sizing"] == "exact"

    def data_key(settings):
        return cache_key("fwe", tokenizer, 1024, settings.seed, **settings.data_options())[1]

    assert data_key(exact) == cache_key("fwe", tokenizer, 1024, exact.seed)[1]
    assert data_key(nvidia) != data_key(exact)


def test_unknown_sizing_is_a_user_error(tokenizer):
    with pytest.raises(UserError, match="unknown RULER sizing 'nvidea'"):
        RulerSettings(sizing="nvidea")
    with pytest.raises(UserError, match="choose from exact, nvidia"):
        generate("fwe", tokenizer, 1024, 2, sizing="nvidea")
    with pytest.raises(UserError):
        cache_key("fwe", tokenizer, 1024, 42, sizing="nvidea")


class EchoEngine:
    """Just enough of an engine for the runner: counts tokens, answers every prompt with a fixed text."""

    def __init__(self, tokenizer):
        self.tokenizer, self.generated = tokenizer, []

    def count_tokens(self, prompt: str) -> int:
        return len(self.tokenizer(prompt)["input_ids"])

    def generate(self, prompts: list[str], max_new_tokens: int) -> list[str]:
        self.generated += prompts
        return ["no idea"] * len(prompts)


def test_results_of_the_two_sizings_never_mix_in_one_sample_log(tokenizer, tmp_path):
    import json

    from evalkit.corpus import tokenizer_fingerprint
    from evalkit.models.precision import engine_dtype
    from evalkit.models.refs import CheckpointRef
    from evalkit.ruler.runner import _evaluate_task, _prompt_hash, answer_key
    from evalkit.ruler.spec import task_spec
    from evalkit.store.units import Unit, UnitStore
    from evalkit.sweep.engine_choice import EngineChoice, LazyEngine

    ref = CheckpointRef("run", 1, tmp_path / "ckpt")
    log = tmp_path / "out" / "run" / "step-1" / "ruler" / "niah_multikey_1" / "2048.jsonl"

    def settings_for(sizing: str) -> RulerSettings:
        return RulerSettings(tasks=["niah_multikey_1"], lengths=[2048], num_samples=4, sizing=sizing)

    def evaluate(sizing: str):
        engine = EchoEngine(tokenizer)
        settings = settings_for(sizing)
        unit_engine = LazyEngine(EngineChoice(), ref.path, lambda *_a, **_k: engine)
        store = UnitStore(tmp_path / "out", ref, "ruler", Unit("niah_multikey_1", 2048))
        spec = task_spec("niah_multikey_1")
        _, data_key, _ = _evaluate_task(unit_engine, tokenizer, spec, settings, store, lambda *_: None)
        return data_key, engine.generated

    exact_key, exact_prompts = evaluate("exact")
    nvidia_key, nvidia_prompts = evaluate("nvidia")
    assert exact_key != nvidia_key
    assert len(nvidia_prompts) == 4 and nvidia_prompts != exact_prompts  # nothing reused from the exact run
    records = [json.loads(line) for line in log.read_text().splitlines()]
    facts = {"dtype": engine_dtype(), "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer)}
    assert {r["key"] for r in records} == {answer_key(settings_for("nvidia"), nvidia_key, facts, {})}
    assert [r["prompt_sha"] for r in records] == [_prompt_hash(p) for p in nvidia_prompts]
    assert evaluate("nvidia")[1] == []  # a rerun with the same sizing computes nothing


def test_cli_sizing_option_reaches_the_settings(monkeypatch):
    from typer.testing import CliRunner

    from evalkit import cli
    from evalkit.cli import options

    seen = []

    def capture(benchmark, *shared_options):
        seen.append(benchmark.settings)
        raise SystemExit(0)

    monkeypatch.setattr(options, "run_command", capture)
    for args, sizing in (([], "exact"), (["--sizing", "nvidia"], "nvidia")):
        result = CliRunner().invoke(cli.app, ["ruler", "--ckpts", "x", "--tasks", "fwe", *args])
        assert result.exit_code == 0, result.output
        assert seen[-1].sizing == sizing
    result = CliRunner().invoke(cli.app, ["ruler", "--ckpts", "x", "--sizing", "nvidea"])
    assert result.exit_code != 0 and "unknown RULER sizing 'nvidea'" in str(result.exception or result.output)
