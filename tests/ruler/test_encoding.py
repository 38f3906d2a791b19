"""`--encoding anchor`: RULER samples as documents behind one anchor.

The split is checked against the sample itself (lossless, needles whole, pieces of the asked
size); the answers against greedy decoding written out by hand over one full forward per token
with the anchor paradigm's mask (evalkit.attention.document_mask for the documents, everything
earlier for the question and answer); summaries and the leaderboard keep both encodings apart.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from evalkit.attention import document_mask
from evalkit.engines import get_engine
from evalkit.engines import tokens as tok
from evalkit.errors import Skipped, UserError
from evalkit.models.refs import CheckpointRef
from evalkit.ruler import generate
from evalkit.ruler.encoding import split_sample
from evalkit.ruler.runner import RulerSettings, _evaluate_task
from evalkit.ruler.sample import Sample
from evalkit.ruler.spec import task_spec
from evalkit.store.result_format import ResultRow
from evalkit.store.units import Unit, UnitStore
from evalkit.sweep.engine_choice import EngineChoice, LazyEngine
from tests.helpers import build_checkpoint, copy_with_config, decode, greedy_without_cache

BUILT_IN = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_2", "niah_multivalue", "vt", "fwe"]
EVALKIT = [sys.executable, "-m", "evalkit.cli"]


def built(engine) -> LazyEngine:
    """The pipeline's lazy engine around one already built (the runner asks it for the engine)."""
    return LazyEngine(EngineChoice(), engine.model_path, lambda *_args, **_kwargs: engine)


def token_count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("task", BUILT_IN)
def test_the_split_is_lossless_and_keeps_every_needle_whole(task, tokenizer):
    spec = task_spec(task)
    for sample in generate(task, tokenizer, 2048, 3):
        split = split_sample(sample, spec, tokenizer, doc_tokens=200)
        assert split.text() == sample.input + sample.answer_prefix
        assert split.question.endswith(sample.answer_prefix) and split.question.strip()
        assert len(split.documents) >= 5 and all(doc.strip() for doc in split.documents)
        context = split.documents[1:]  # the first document is the task's instruction
        head = spec.template.split("{context}")[0]  # the instruction: the template's text before its context
        if task.startswith("niah"):
            assert split.documents[0].endswith(" afterwards.\n") and split.documents[0].count("\n") == 1
        else:
            assert split.documents[0] == head
        assert all(token_count(tokenizer, doc) >= 190 for doc in context[:-1])  # cut once ~200 tokens are in
        if task.startswith("niah"):
            for value in sample.outputs:  # each needle's value sits whole in one document
                assert sum(value in doc for doc in context) == 1
                assert value not in split.question


def test_qa_documents_are_the_tasks_own_documents(tokenizer, qa_dir):
    spec = task_spec("qa_2")
    (sample,) = generate("qa_2", tokenizer, 2048, 1, qa_dir=qa_dir)
    split = split_sample(sample, spec, tokenizer, doc_tokens=10)  # doc_tokens has no say for qa
    assert split.text() == sample.input + sample.answer_prefix
    blocks = split.documents[1:]
    assert [block.lstrip("\n").split(":")[0] for block in blocks] == [
        f"Document {i}" for i in range(1, len(blocks) + 1)
    ]
    assert split.question.startswith("\n\nAnswer the question based on the given documents.")


def test_a_sample_off_its_template_is_skipped_not_guessed(tokenizer):
    spec = task_spec("niah_single_1")
    stray = Sample(0, "Not a RULER prompt at all.", spec.answer_prefix, ["1"], 10)
    with pytest.raises(Skipped, match="does not follow the task's template"):
        split_sample(stray, spec, tokenizer, 100)


@pytest.fixture(scope="module")
def long_checkpoint(tmp_path_factory, tokenizer):
    """(path, model): a tiny random Llama whose window (2K) fits anchor-encoded 1K RULER samples."""
    short = tmp_path_factory.mktemp("tiny-llama")
    build_checkpoint(short, tokenizer, seed=3)
    path = copy_with_config(short, tmp_path_factory.mktemp("long") / "step-1", max_position_embeddings=2048)
    engine = get_engine("hf", path, dtype="fp32", device="cpu")
    model = engine.model
    model.set_attn_implementation("sdpa")
    return path, model


def anchor_mask(layout: tok.PackedLayout, length: int) -> torch.Tensor:
    """The definition, written out: documents see themselves and the anchor; the rest sees all before it."""
    n = layout.num_document_tokens
    mask = torch.tril(torch.ones(length, length, dtype=torch.bool))
    mask[:n, :n] = document_mask(torch.tensor(layout.doc_ids), n)
    return mask


@pytest.mark.parametrize("task", ["niah_single_1", "vt"])
def test_anchor_answers_equal_greedy_decoding_under_the_reference_mask(task, long_checkpoint, tokenizer, tmp_path):
    path, model = long_checkpoint
    engine = get_engine("hf", path, dtype="fp32", device="cpu", batch_size=2)
    settings = RulerSettings(tasks=[task], lengths=[1024], num_samples=3, encoding="anchor", doc_tokens=150)
    ref = CheckpointRef("tiny", 1, path)
    store = UnitStore(tmp_path, ref, "ruler", Unit(task, 1024))
    row, _, _ = _evaluate_task(built(engine), engine.tokenizer, task_spec(task), settings, store, lambda *_: None)
    log = tmp_path / "tiny" / "step-1" / "ruler" / task / "1024.anchor-150.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    spec = task_spec(task)
    for sample, record in zip(generate(task, engine.tokenizer, 1024, 3), records):
        split = split_sample(sample, spec, engine.tokenizer, 150)
        layout = tok.packed_layout(engine.tokenizer, split.documents, split.question)
        assert layout.input_ids.count(engine.tokenizer.eos_token_id) >= len(split.documents)  # one EOS each
        expected = greedy_without_cache(
            model,
            layout.input_ids,
            spec.max_new_tokens,
            {engine.tokenizer.eos_token_id},
            mask_for=lambda n, layout=layout: anchor_mask(layout, n),
        )
        assert record["prediction"] == decode(engine.tokenizer, expected)
        assert record["documents"] == len(split.documents) and record["packed_tokens"] == len(layout.input_ids)
    assert row.encoding == "anchor" and row.doc_tokens == 150 and row.n == 3


def test_a_length_at_the_window_is_skipped_with_the_reason(long_checkpoint, tmp_path):
    path, _ = long_checkpoint
    engine = get_engine("hf", path, dtype="fp32", device="cpu")
    settings = RulerSettings(tasks=["niah_single_1"], lengths=[1024], num_samples=2, encoding="anchor", doc_tokens=64)
    # A window just too short for the budget beside the samples' packed requests (one EOS per document more):
    longest = max(
        len(tok.packed_layout(engine.tokenizer, split.documents, split.question).input_ids)
        for split in (split_sample(s, task_spec("niah_single_1"), engine.tokenizer, 64)
                      for s in generate("niah_single_1", engine.tokenizer, 1024, 2))
    )  # fmt: skip
    engine.max_length = longest + 128 - 1
    with pytest.raises(Skipped, match="anchor encoding adds one EOS per document"):
        store = UnitStore(tmp_path, CheckpointRef("tiny", 1, path), "ruler", Unit("niah_single_1", 1024))
        _evaluate_task(built(engine), engine.tokenizer, task_spec("niah_single_1"), settings, store, lambda *_: None)


def test_bad_encoding_settings_are_one_line():
    with pytest.raises(UserError, match="--encoding must be one of standard, anchor"):
        RulerSettings(encoding="anchors")
    with pytest.raises(UserError, match="--doc-tokens must be a positive number"):
        RulerSettings(encoding="anchor", doc_tokens=0)
    with pytest.raises(UserError, match="drop --prompt-format chat"):
        RulerSettings(encoding="anchor", prompt_format="chat")


@pytest.mark.slow
def test_both_encodings_in_one_summary_and_two_leaderboard_rows(long_checkpoint, tmp_path):
    path, _ = long_checkpoint
    out = tmp_path / "out"
    common = ["ruler", "--ckpts", str(path), "--lengths", "1k", "--tasks", "niah_single_1,fwe", "--samples", "2",
              "--dtype", "fp32", "--out", str(out)]  # fmt: skip
    for extra in ([], ["--encoding", "anchor", "--doc-tokens", "128"]):
        result = subprocess.run([*EVALKIT, *common, *extra], capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
    summary = json.loads(next(out.glob("*/step-1/ruler-summary.json")).read_text())
    cells = [(r["task"], r.get("encoding", "standard")) for r in summary["rows"]]
    assert cells == [("niah_single_1", "standard"), ("niah_single_1", "anchor"), ("fwe", "standard"), ("fwe", "anchor")]
    assert set(summary["provenance"]["data_keys"]) == {
        "niah_single_1@1024", "niah_single_1@1024@anchor-128", "fwe@1024", "fwe@1024@anchor-128"
    }  # fmt: skip
    anchor_run = ResultRow(
        "ruler", summary["run"], 0, "vt", "string_match_all", 0.0, encoding="anchor", doc_tokens=128
    ).series()
    board = subprocess.run(
        [*EVALKIT, "leaderboard", str(out), "--out", str(tmp_path / "board.md")], capture_output=True, text=True
    )
    assert board.returncode == 0, board.stderr
    text = (tmp_path / "board.md").read_text()
    main_table = text.split("## RULER per task")[0]
    assert f"| {summary['run']} |" in main_table and f"| {anchor_run} |" in main_table
    assert "1 ckpt × 2 tasks × 2 samples" in main_table
