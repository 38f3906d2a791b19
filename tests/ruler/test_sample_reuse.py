"""Stored answers are reused whatever the sample count: growing a pilot computes only the new
samples, shrinking computes nothing, and either equals a fresh run of that count. A setting
that changes answers (seed, window) is answered anew; one that changes speed (batch size) is
not. (The committed results carry the current keys: tests/results/test_committed_results.py.)
"""

import dataclasses
import json
from pathlib import Path

import pytest

import evalkit.engines
from evalkit.models.refs import resolve_checkpoints
from evalkit.ruler import generate, load_or_generate
from evalkit.ruler.runner import RulerBenchmark, RulerSettings
from evalkit.sweep.pipeline import run_benchmark
from tests.sweep.helpers import SHIPPED_ANCHOR

SHIPPED = SHIPPED_ANCHOR / "step-600"  # trained bf16_full: served so (bf16) unless told serving=stock
TASK, LENGTH = "niah_single_1", 1024


@pytest.fixture
def answered(monkeypatch):
    """Every prompt an engine is asked to answer, in order (real engines, counted)."""
    prompts: list = []
    real = evalkit.engines.get_engine

    def counting(*args, **kwargs):
        engine = real(*args, **kwargs)
        generate_ = engine.generate
        engine.generate = lambda batch, *a, **k: prompts.extend(batch) or generate_(batch, *a, **k)
        return engine

    monkeypatch.setattr(evalkit.engines, "get_engine", counting)
    return prompts


def evaluate(out: Path, samples: int, **changes) -> dict:
    """Served stock, in fp32: a grown run equals a fresh one record for record only where an answer does
    not depend on its batch (in bf16, padding to another batch's length changes the rounding)."""
    stock = {"dtype": "fp32", "engine_args": {"serving": "stock"}}
    settings = RulerSettings(tasks=[TASK], lengths=[LENGTH], num_samples=samples, **{**stock, **changes})
    (summary,) = run_benchmark(RulerBenchmark(settings), resolve_checkpoints([str(SHIPPED)]), out).summaries
    return summary


def log_records(out: Path) -> dict[int, dict]:
    path = out / SHIPPED_ANCHOR.name / "step-600" / "ruler" / TASK / f"{LENGTH}.jsonl"
    return {record["index"]: record for record in map(json.loads, path.read_text().splitlines())}


def test_growing_computes_only_new_samples_and_shrinking_none(tmp_path, answered):
    pilot = evaluate(tmp_path / "grown", 3)
    assert len(answered) == 3 and pilot["rows"][0]["n"] == 3

    grown = evaluate(tmp_path / "grown", 6)
    assert len(answered) == 6  # exactly the 3 new samples were answered
    fresh = evaluate(tmp_path / "fresh", 6)
    assert len(answered) == 12 and answered[3:6] == answered[9:12]  # the fresh run's samples 3..5
    assert grown["rows"] == fresh["rows"] and grown["rows"][0]["n"] == 6
    assert log_records(tmp_path / "grown") == log_records(tmp_path / "fresh")  # record for record

    del answered[:]
    shrunk = evaluate(tmp_path / "grown", 3)
    assert answered == [] and shrunk["rows"] == pilot["rows"]  # the first 3 of 6, nothing computed
    assert len(log_records(tmp_path / "grown")) == 6  # the other answers stay stored for later

    from evalkit.results.samples import load_series  # `evalkit compare` reads the 3 the summary scored

    (series,) = load_series([str(tmp_path / "grown")]).values()
    (cells,) = series.checkpoints.values()
    assert [len(samples) for samples in cells.values()] == [3]


def test_settings_that_change_answers_are_answered_anew_batch_size_is_not(tmp_path, answered):
    out = tmp_path / "out"
    first = evaluate(out, 2)
    assert len(answered) == 2

    del answered[:]
    again = evaluate(out, 2, batch_size=1)  # execution only
    assert answered == [] and again["rows"] == first["rows"]

    for changed in ({"seed": 7}, {"max_length": 2048}):
        del answered[:]
        evaluate(out, 2, **changed)
        assert len(answered) == 2, changed


def test_samples_of_every_kind_do_not_depend_on_the_count(small_tokenizer, qa_dir, tmp_path, monkeypatch):
    from evalkit.ruler.spec import TASKS

    for task in TASKS:
        six = generate(task, small_tokenizer, 2048, 6, qa_dir=qa_dir)
        assert generate(task, small_tokenizer, 2048, 3, qa_dir=qa_dir) == six[:3], task
        assert generate(task, small_tokenizer, 2048, 6, qa_dir=qa_dir, first=six[:2]) == six, task
        for sizing in ("nvidia",):
            nvidia = generate(task, small_tokenizer, 2048, 5, qa_dir=qa_dir, sizing=sizing)
            assert generate(task, small_tokenizer, 2048, 5, qa_dir=qa_dir, sizing=sizing, first=nvidia[:1]) == nvidia

    # The cache: a longer request extends the one file (only the missing samples generated), a
    # shorter one is served its prefix without generating anything.
    import evalkit.ruler.generation as generation

    asked = []
    real = generation.generate
    monkeypatch.setattr(generation, "generate", lambda *a, **k: asked.append(len(k.get("first", ()))) or real(*a, **k))
    three = load_or_generate("fwe", small_tokenizer, 2048, 3, cache_dir=tmp_path)
    seven = load_or_generate("fwe", small_tokenizer, 2048, 7, cache_dir=tmp_path)
    assert asked == [0, 3] and seven[:3] == three and seven == real("fwe", small_tokenizer, 2048, 7)
    assert load_or_generate("fwe", small_tokenizer, 2048, 5, cache_dir=tmp_path) == seven[:5] and asked == [0, 3]
    assert len(list(tmp_path.rglob("*.jsonl"))) == 1


def string_match_all(prediction: str, references: list[str]) -> float:
    """RULER's per-sample metric, by hand (ruler.md): share of references found, case-insensitive."""
    text = "".join("\n" if ord(c) < 32 else c for c in prediction.strip()).lower()
    return 100 * sum(r.lower() in text for r in references) / len(references)


def test_stored_answers_are_reused_not_recomputed(tmp_path, monkeypatch):
    """A run's stored answers (4 samples per cell, standard and anchor encoded): the same cells at 2
    and at 4 samples come from its logs, with no engine built; at 4, the very rows it stored."""
    out = tmp_path / "out"
    ref = resolve_checkpoints([str(SHIPPED)])

    def settings(encoding: str, samples: int) -> RulerSettings:
        return RulerSettings(
            tasks=["niah_single_1", "niah_multikey_1"],
            lengths=[512],
            num_samples=samples,
            encoding=encoding,
            doc_tokens=128,
        )

    for encoding in ("standard", "anchor"):
        run_benchmark(RulerBenchmark(settings(encoding, 4)), ref, out)
    checkpoint = out / SHIPPED_ANCHOR.name / "step-600"
    stored = json.loads((checkpoint / "ruler-summary.json").read_text())
    assert len(stored["rows"]) == 4  # both encodings' cells, in one summary

    def no_engine(*_args, **_kwargs):
        raise AssertionError("an engine was built for answers already stored")

    monkeypatch.setattr(evalkit.engines, "get_engine", no_engine)
    for encoding in ("standard", "anchor"):
        for samples in (2, 4, 2):
            (summary,) = run_benchmark(RulerBenchmark(settings(encoding, samples)), ref, out).summaries
            for row in summary["rows"]:  # each row from its own encoding's log, the first n samples
                name = f"{row['task']}/512{'.anchor-128' if row.get('encoding') == 'anchor' else ''}.jsonl"
                lines = (checkpoint / "ruler" / name).read_text().splitlines()
                records = [r for r in map(json.loads, lines) if r["index"] < row["n"]]  # the log keeps all 4
                by_hand = sum(string_match_all(r["prediction"], r["references"]) for r in records) / row["n"]
                assert len(records) == row["n"] and row["value"] == pytest.approx(by_hand, abs=0.005)
            asked = [row for row in summary["rows"] if row.get("encoding", "standard") == encoding]
            assert sorted(row["task"] for row in asked) == ["niah_multikey_1", "niah_single_1"]
            assert all(row["n"] == samples for row in asked)
            if samples == 4:  # the very rows the summary held
                assert all(row in stored["rows"] for row in asked)


def test_a_units_keys_are_derived_once_per_unit_and_the_engine_facts_are_the_engines(tmp_path, answered, monkeypatch):
    """Each unit's data key (ruler.cache.data_key) and answer key (its hash, identity_key) are
    computed once per unit, on a run that answers and on one that reads everything back; the engine
    facts the answers were keyed under before the engine was built are those the built engine records."""
    import evalkit.ruler.cache as cache
    import evalkit.ruler.runner as runner
    from evalkit.corpus import tokenizer_fingerprint

    derived = {"data": 0, "answers": 0}

    def counted(name, real):
        return lambda *a, **k: derived.__setitem__(name, derived[name] + 1) or real(*a, **k)

    monkeypatch.setattr(cache, "data_key", counted("data", cache.data_key))
    monkeypatch.setattr(runner, "identity_key", counted("answers", runner.identity_key))
    settings = RulerSettings(tasks=[TASK, "vt"], lengths=[LENGTH], num_samples=2)  # no dtype: the engine's default
    ref = resolve_checkpoints([str(SHIPPED)])
    (summary,) = run_benchmark(RulerBenchmark(settings), ref, tmp_path).summaries
    assert len(answered) == 4 and derived == {"data": 2, "answers": 2}  # two units
    served = RulerBenchmark(settings).engine.served(SHIPPED).dtype
    assert served == "bf16"  # the regime it trained in (bf16_full), not the engine's CPU default
    asked = dataclasses.replace(settings, dtype=served)  # the default, asked for: the same answers
    run_benchmark(RulerBenchmark(asked), ref, tmp_path)
    assert len(answered) == 4 and derived == {"data": 4, "answers": 4}  # read back: once per unit again

    engine = summary["provenance"]["engine"]
    tokenizer = runner.load_tokenizer(SHIPPED)
    predicted = {
        "dtype": served,
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
    }
    assert predicted == {"dtype": engine["dtype"], "tokenizer_fingerprint": engine["tokenizer_fingerprint"]}
