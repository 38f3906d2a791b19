"""The disk cache: JSON round trip, reuse without generation, byte-identical files across processes."""

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest

from evalkit.ruler import Sample, cache_path, dumps_jsonl, load_or_generate, loads_jsonl
from evalkit.ruler import cache as cache_module


def test_sample_json_round_trip():
    sample = Sample(3, "text with \u00e9 and \n", " Answer:", ["a", "B c"], 17)
    assert Sample.from_json(sample.to_json()) == sample
    assert loads_jsonl(dumps_jsonl([sample, sample])) == [sample, sample]


def test_second_load_reads_the_file_and_generates_nothing(tokenizer, tmp_path, monkeypatch):
    first = load_or_generate("niah_single_1", tokenizer, 2048, 3, cache_dir=tmp_path)
    path = cache_path("niah_single_1", tokenizer, 2048, cache_dir=tmp_path)
    _, samples = path.read_text().split("\n", 1)  # a checksum header, then the samples
    assert path.is_file() and loads_jsonl(samples) == first and cache_module.read_entry(path, 3) == first

    def no_generation(*args, **kwargs):
        raise AssertionError("generated on a cache hit")

    monkeypatch.setattr("evalkit.ruler.generation.generate", no_generation)
    assert load_or_generate("niah_single_1", tokenizer, 2048, 3, cache_dir=tmp_path) == first


def test_the_key_covers_what_decides_the_data(tokenizer, small_tokenizer, tmp_path, monkeypatch):
    base = cache_path("fwe", tokenizer, 4096, 42, tmp_path)
    others = {
        cache_path("fwe", tokenizer, 4096, 43, tmp_path),
        cache_path("fwe", tokenizer, 8192, 42, tmp_path),
        cache_path("fwe", small_tokenizer, 4096, 42, tmp_path),
        cache_path("cwe", tokenizer, 4096, 42, tmp_path),
        cache_path("fwe", tokenizer, 4096, 42, tmp_path, exact_lengths=True),
    }
    assert base not in others and len(others) == 5
    assert cache_path("niah_single_2", tokenizer, 4096, 42, tmp_path) != cache_path(
        "niah_single_2", tokenizer, 4096, 42, tmp_path, essays="Some other essay. It has sentences."
    )
    monkeypatch.setattr(cache_module, "GENERATOR_VERSION", 999)
    assert cache_path("fwe", tokenizer, 4096, 42, tmp_path) != base


SCRIPT = """
import sys
from pathlib import Path
from evalkit.corpus import builtin_tokenizer
from evalkit.ruler import TASKS, load_or_generate
tokenizer = builtin_tokenizer(512)
for task in TASKS:
    load_or_generate(task, tokenizer, 3000, 3, seed=9, cache_dir=Path(sys.argv[1]), qa_dir=sys.argv[2])
"""


@pytest.mark.parametrize("hash_seeds", [("1", "2")])
def test_two_processes_write_byte_identical_files(hash_seeds, tmp_path, qa_dir, small_tokenizer):
    outputs = []
    for i, hash_seed in enumerate(hash_seeds):
        out = tmp_path / f"run{i}"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run([sys.executable, "-c", SCRIPT, str(out), str(qa_dir)], check=True, env=env, timeout=120)
        outputs.append({p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*.jsonl"))})
    assert len(outputs[0]) >= 12  # every task but cwe, which does not fit 3000 with this tokenizer
    assert outputs[0] == outputs[1]


def test_the_tokenizer_fingerprint_is_remembered_per_tokenizer_and_renewed_when_it_changes(small_tokenizer):
    """RULER keys every task at every length by the tokenizer's fingerprint: computed once per
    tokenizer object, and computed again for one whose tokens or specials changed since."""
    import copy

    from evalkit.corpus import tokenizer as fingerprints

    tokenizer = copy.deepcopy(small_tokenizer)
    first = fingerprints.tokenizer_fingerprint(tokenizer)
    assert fingerprints._FINGERPRINTS[tokenizer][1] == first
    assert fingerprints.tokenizer_fingerprint(copy.deepcopy(tokenizer)) == first  # a fresh object, computed anew
    tokenizer.add_tokens(["<|a-token-of-this-test|>"])
    grown = fingerprints.tokenizer_fingerprint(tokenizer)
    assert grown != first and grown == fingerprints.tokenizer_fingerprint(copy.deepcopy(tokenizer))


def test_an_entry_of_the_format_before_depths_is_regenerated_not_served_without_them(tokenizer, tmp_path, capsys):
    """Its data key is today's (the format is not in it): only the header's format tells it apart."""
    samples = load_or_generate("niah_multivalue", tokenizer, 2048, 2, cache_dir=tmp_path)
    path = cache_path("niah_multivalue", tokenizer, 2048, cache_dir=tmp_path)
    text = "".join(json.dumps({k: v for k, v in asdict(s).items() if k != "depths"}, sort_keys=True) + "\n"
                   for s in samples)  # fmt: skip
    header = {"format": "evalkit-ruler-cache", "samples": 2, "sha256": hashlib.sha256(text.encode()).hexdigest()}
    path.write_text(json.dumps(header) + "\n" + text)
    capsys.readouterr()
    served = load_or_generate("niah_multivalue", tokenizer, 2048, 2, cache_dir=tmp_path)
    assert served == samples and all(len(s.depths) == 4 for s in served)
    assert "older format" in capsys.readouterr().err
    assert cache_module.read_entry(path, 2) == samples  # rewritten in today's format
