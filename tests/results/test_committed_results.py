"""The committed results under results/ are of the current schema and keys (migrated once each
time they changed: results/README.md): every summary is read as this version's, and every RULER answer carries its
checksum and the key this evalkit derives for its cell, from today's generator, the summary's
settings and the engine facts it recorded. Nothing under results/ needs a compatibility path."""

import dataclasses
import json
from pathlib import Path

import pytest

from evalkit.ruler.cache import data_key
from evalkit.ruler.runner import RulerSettings, answer_key
from evalkit.store.result_format import SCHEMA_VERSION, STANDARD, encoding_label, not_understood
from evalkit.store.sample_log import CHECKSUM, KEY, SampleLog, record_checksum

RESULTS = Path(__file__).resolve().parents[2] / "results"
# The committed results: not the README's first command's own output (results/quickstart/, ignored
# by git), which a newcomer's checkout holds before the tests run.
SUMMARIES = sorted(p for p in RESULTS.rglob("*-summary.json") if not p.is_relative_to(RESULTS / "quickstart"))


BORN_AFTER_THE_MIGRATION = ("study-pilot", "study")  # results folders written by the current keys


def test_results_hold_the_summaries_the_migration_rewrote():
    """The 13 RULER and lm-eval summaries the keys' migration rewrote (ppl's was born with them)."""
    older = [p for p in SUMMARIES if p.relative_to(RESULTS).parts[0] not in BORN_AFTER_THE_MIGRATION]
    assert len([p for p in older if p.name in ("ruler-summary.json", "general-summary.json")]) == 13


@pytest.mark.parametrize("path", SUMMARIES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_summary_is_of_the_current_schema(path):
    summary = json.loads(path.read_text())
    assert summary["schema_version"] == SCHEMA_VERSION and not_understood(path, summary) is None
    assert "legacy_cells" not in summary["provenance"]


@pytest.mark.parametrize(
    "path", [p for p in SUMMARIES if p.name == "ruler-summary.json"], ids=lambda p: str(p.relative_to(RESULTS))
)
def test_every_ruler_answer_is_keyed_as_this_evalkit_keys_it(path):
    summary = json.loads(path.read_text())
    provenance = summary["provenance"]
    settings = RulerSettings(**provenance["settings"])  # complete: every field of today's settings
    engine = provenance["engine"]
    facts = {"dtype": engine["dtype"], "tokenizer_fingerprint": engine["tokenizer_fingerprint"]}
    trained_in = provenance["checkpoint_meta"].get("precision", {}).get("dtype", "fp32")
    if engine.get("serving") == "trained" and trained_in != "fp32":  # unlike a stock serving: keyed by the regime
        facts["served"] = (
            f"{engine['dtype']}, RoPE frequencies {engine['rope_frequencies']}, rotation {engine['rope_rotation']}"
        )
    for row in summary["rows"]:
        label = encoding_label(row.get("encoding"), row.get("doc_tokens"))
        cell = dataclasses.replace(
            settings, encoding=row.get("encoding", STANDARD), doc_tokens=row.get("doc_tokens", 512)
        )
        data = data_key(row["task"], row["length"], settings.seed, **settings.data_options())
        cell_name = f"{row['task']}@{row['length']}" + ("" if label == STANDARD else f"@{label}")
        assert provenance["data_keys"][cell_name] == data
        log = (
            path.parent
            / "ruler"
            / row["task"]
            / (f"{row['length']}.jsonl" if label == STANDARD else f"{row['length']}.{label}.jsonl")
        )
        records = [json.loads(line) for line in log.read_text().splitlines()]
        assert all(CHECKSUM in r and r[CHECKSUM] == record_checksum(r) and "data_key" not in r for r in records)
        if row["task"].startswith("niah"):  # where each needle was (migrated once: results/README.md)
            assert all(len(r["depths"]) == len(r["references"]) for r in records), log
        key = answer_key(cell, data, facts, {})
        assert {r[KEY] for r in records} == {key}, log
        assert len(SampleLog(log, key).records) == len(records) >= row["n"]  # all of it reused by a rerun
