"""The registry of RULER's task kinds: every task's kind registered, its generator found, and its
module constants keyed into the cache (change one, the key changes; as they are, keys hold)."""

import pytest

from evalkit.ruler import SPECS, generate
from evalkit.ruler import kinds as kinds_module
from evalkit.ruler.cache import cache_key
from evalkit.ruler.kinds import CONSTANTS_DIGESTS_AT_V1, KINDS, constants_digest, generator_class

ONE_TASK_PER_KIND = {spec.kind: name for name, spec in reversed(SPECS.items())}


def test_every_task_kind_is_registered_and_recorded():
    assert {spec.kind for spec in SPECS.values()} == set(KINDS) == set(CONSTANTS_DIGESTS_AT_V1)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_constants_are_those_of_version_1(kind):
    # A failure here means a generator constant changed: cached samples of this kind are
    # regenerated (their key changed), which is right; bump GENERATOR_VERSION if that was meant.
    assert constants_digest(kind) == CONSTANTS_DIGESTS_AT_V1[kind]
    assert isinstance(generator_class(kind), type)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_changing_a_generator_constant_changes_the_cache_key(kind, tokenizer, monkeypatch):
    task = ONE_TASK_PER_KIND[kind]
    before = cache_key(task, tokenizer, 2048, 1)
    module = kinds_module._module(kind)
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
