"""The registry of RULER's task kinds: every task's kind registered, its generator found, and its
module constants keyed into the cache (change one, the key changes; as they are, keys hold)."""

import re
from pathlib import Path

import pytest

from evalkit.ruler import SPECS, generate
from evalkit.ruler import kinds as kinds_module
from evalkit.ruler.cache import cache_key
from evalkit.ruler.encoding import split_sample
from evalkit.ruler.kinds import KINDS, generator_class
from evalkit.ruler.spec import task_spec

ONE_TASK_PER_KIND = {spec.kind: name for name, spec in reversed(SPECS.items())}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_task_kind_is_registered_with_its_generator(kind):
    assert {spec.kind for spec in SPECS.values()} == set(KINDS)
    assert isinstance(generator_class(kind), type)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_changing_a_generator_constant_changes_the_cache_key(kind, tokenizer, monkeypatch):
    task = ONE_TASK_PER_KIND[kind]
    before = cache_key(task, tokenizer, 2048, 1)
    module = kinds_module.KINDS[kind].load()
    name, value = next(iter(module.DATA_CONSTANTS.items()))
    monkeypatch.setattr(module, "DATA_CONSTANTS", {**module.DATA_CONSTANTS, name: (value, "changed")})
    after = cache_key(task, tokenizer, 2048, 1)
    assert after[0] == before[0] and after[1] != before[1]
    monkeypatch.undo()
    assert cache_key(task, tokenizer, 2048, 1) == before


def test_a_generator_comes_from_the_registry(tokenizer, monkeypatch):
    """generate() builds its generator through the registry: a kind pointed elsewhere is used."""
    calls = []
    real = kinds_module.generator_class

    def recording(kind):
        calls.append(kind)
        return real(kind)

    monkeypatch.setattr("evalkit.ruler.generation.generator_class", recording)
    samples = generate("niah_single_1", tokenizer, 512, 2, seed=0)
    assert len(samples) == 2 and calls and set(calls) == {"niah"}


def test_no_kind_is_branched_on_outside_the_registry():
    """What differs by kind is asked of the kind (kinds/): no module beside it compares a kind's name."""
    ruler = Path(kinds_module.__file__).parents[1]
    names = "|".join(map(re.escape, KINDS))
    branch = re.compile(rf"\.kind\s*(==|!=|in\b)|(==|!=)\s*[\"']({names})[\"']")
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(ruler.glob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if branch.search(line)
    ]
    assert not found, "\n".join(found)


def test_per_kind_behaviour_comes_from_the_kinds_module(tokenizer, monkeypatch):
    """The cache's data identity and anchor encoding's documents are what the kind's module says:
    a kind given a context_documents function (vt has none) is split by it, not cut by tokens."""
    spec = task_spec("vt")
    (sample,) = generate(spec, tokenizer, 1024, 1, seed=0)
    by_tokens = split_sample(sample, spec, tokenizer, 64)
    module = kinds_module.KINDS["variable_tracking"].load()
    monkeypatch.setattr(module, "context_documents", lambda context: [context[:10], context[10:]], raising=False)
    split = split_sample(sample, spec, tokenizer, 64)
    head = sample.input[: sample.input.index("\n\n") + 2]  # the template's instruction line and blank line
    assert split.documents[0] == head and len(split.documents) == 3 and len(by_tokens.documents) > 3
    assert split.documents[1] == sample.input[len(head) : len(head) + 10]
    assert split.text() == by_tokens.text() == sample.input + sample.answer_prefix

    before = cache_key(spec, tokenizer, 1024, 0)
    monkeypatch.setattr(module, "data_identity", lambda *_: ["a file vt now reads"], raising=False)
    assert cache_key(spec, tokenizer, 1024, 0) != before


def test_a_unit_resolves_its_spec_once(tokenizer, tmp_path, monkeypatch):
    """RULER looks a task up once (the benchmark, when built) and passes the spec to the cache, the generator and the
    metrics (not once per sample); an engine that echoes the prompt finds every needle: 100."""
    import evalkit.ruler.runner as runner
    import evalkit.ruler.spec as spec_module
    from evalkit.models.refs import CheckpointRef
    from evalkit.store.units import Unit, UnitStore
    from evalkit.sweep.engine_choice import EngineChoice, LazyEngine

    class Echo:
        def count_tokens(self, prompt):
            return len(tokenizer(prompt)["input_ids"])

        def generate(self, prompts, max_new_tokens):
            return list(prompts)

    lookups = []

    class CountedSpecs(dict):  # every task_spec(name), wherever it is imported, reads spec.SPECS
        def __getitem__(self, task):
            lookups.append(task)
            return super().__getitem__(task)

    monkeypatch.setattr(spec_module, "SPECS", CountedSpecs(spec_module.SPECS))
    engine = LazyEngine(EngineChoice("hf"), tmp_path, open_engine=lambda *_a, **_k: Echo())
    settings = runner.RulerSettings(tasks=["niah_single_1"], lengths=[512], num_samples=3)
    benchmark = runner.RulerBenchmark(settings)  # resolves each task's spec, once
    benchmark._tokenizers[tmp_path] = tokenizer
    unit = Unit("niah_single_1", 512)
    result = benchmark.evaluate(
        engine, unit, UnitStore(tmp_path, CheckpointRef("run", 1, tmp_path), "ruler", unit), lambda *_: None
    )
    assert lookups == ["niah_single_1"]
    (row,) = result.rows
    assert (row.task, row.metric, row.value, row.n, result.computed) == (
        "niah_single_1",
        "string_match_all",
        100.0,
        3,
        True,
    )
